"""InferenceX's own agentic scripts, unchanged and as subprocesses, on the files the plugin writes
for an agentic point replayed against the simulated HTTP server: `process_agentic_result.py`
makes the same result JSON as the plugin (every number to 0.1 %), `validate_agentic_result.py`
accepts the AIPerf aggregate, the plugin's flat keys agree with InferenceX's numbers, and the
point's table and JUnit properties show them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_agentic_entries import write

from pytest_inferbench.recipe.model import BenchPoint
from pytest_inferbench.recipe.schema import load_recipe
from pytest_inferbench.report.tables import columns
from pytest_inferbench.results.agentic import ReplayMeta, inferencex_failures
from pytest_inferbench.results.agentic_files import (
    AGENTIC_DIR,
    ARTIFACTS,
    EXPORT,
    SERVER_METRICS,
    agentic_env,
)
from pytest_inferbench.results.build import build_result
from pytest_inferbench.results.measurement import PointMeasurement
from pytest_inferbench.results.metrics import RequestRecord
from pytest_inferbench.results.point_files import point_record, write_point_files
from pytest_inferbench.results.record import JSONValue, PointRecord

CURRENT = Path(__file__).resolve().parents[2].parent / "shared" / "inferencex-0801"
AGGREGATION = CURRENT / "utils" / "agentic" / "aggregation" / "process_agentic_result.py"
VALIDATOR = CURRENT / "utils" / "agentic" / "validation" / "validate_agentic_result.py"
needs_tree = pytest.mark.skipif(not AGGREGATION.is_file(),
                                reason=f"no current InferenceX tree at {CURRENT}")
RUN = ("-p", "no:cacheprovider", "--inferbench-backend=sim-server",
       "--inferbench-time-scale=0", "--inferbench-replay-duration=1.5", "--inferbench-no-plots",
       "--junitxml=junit.xml",
       "-m", "inferbench(exp_name='qwen3.5_tp8_conc4_kvnone_spec-mtp')")
REL = 1e-3  # agreement asked of every number
# The plugin's numbers InferenceX's tree at this commit does not compute: the E2E-normalized
# interactivity (InferenceX-app derives it from profile_export.jsonl) and the recorded output
# lengths (InferenceX looks them up in a Hugging Face cache this machine does not have).
PLUGIN_ONLY = {"request_metrics.latency.e2e_norm_intvty", "request_metrics.tokens.output_expected"}


def _sent_tokens(export: Path) -> tuple[int, int]:
    """The prompt and output tokens of every request of a point's `profile_export.jsonl`,
    warmup included."""
    lines = [json.loads(line) for line in export.read_text(encoding="utf-8").splitlines()]
    return (sum(x["metrics"]["usage_prompt_tokens"]["value"] for x in lines),
            sum(x["metrics"]["usage_completion_tokens"]["value"] for x in lines))


def _leaves(value: object, path: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for key, inner in value.items():
            out |= _leaves(inner, f"{path}.{key}" if path else str(key))
        return out
    return {path: value}


def _close(a: object, b: object) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= REL * max(abs(a), abs(b))
    return a == b


def _inferencex(record: dict[str, object], results: Path, out: Path,
                ) -> subprocess.CompletedProcess[str]:
    """`process_agentic_result.py` on a point's files, in the job's environment."""
    name = str(record["result_filename"])
    job = {**os.environ, **agentic_env(record), "RESULT_FILENAME": name,
           "RESULT_DIR": str(results / AGENTIC_DIR / name), "AGENTIC_OUTPUT_DIR": str(out),
           "HF_HUB_CACHE": str(out / "no-hf-cache")}
    return subprocess.run(
        [sys.executable, "-m", "utils.agentic.aggregation.process_agentic_result"],
        cwd=CURRENT, env=job, capture_output=True, text=True, timeout=120, check=False)


def _differences(ours: object, theirs: object) -> dict[str, object]:
    """Every leaf that differs (beyond 0.1 %) or that only one side has, but the plugin's
    own numbers (`PLUGIN_ONLY`)."""
    mine, other = _leaves(ours), _leaves(theirs)
    out: dict[str, object] = {k: ("only ours", mine[k]) for k in set(mine) - set(other)
                              if not any(k.startswith(p) for p in PLUGIN_ONLY)}
    out |= {k: ("only InferenceX", other[k]) for k in set(other) - set(mine)}
    out |= {k: (mine[k], other[k]) for k in set(mine) & set(other)
            if not _close(mine[k], other[k])}
    return out


@pytest.fixture(scope="module")
def agentic_point(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One agentic point run through pytest (a subprocess), then InferenceX's two scripts."""
    root = tmp_path_factory.mktemp("agentic-point")
    write(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH"))
        if p)}
    run = subprocess.run([sys.executable, "-m", "pytest", *RUN], cwd=root, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    results = root / "inferbench-results"
    (raw,) = [p for p in (results / "points").glob("*.json") if not p.name.startswith("agg_")]
    record = point_record(json.loads(raw.read_text(encoding="utf-8")))
    name = str(record["result_filename"])
    result_dir = results / AGENTIC_DIR / name
    out = root / "inferencex-out"
    aggregated = _inferencex(record, results, out)
    assert aggregated.returncode == 0, aggregated.stderr
    validated = subprocess.run(
        [sys.executable, str(VALIDATOR), str(result_dir / ARTIFACTS),
         "--failed-request-threshold", "0.10"],
        cwd=CURRENT, capture_output=True, text=True, timeout=60, check=False)
    return {"record": record, "ours": json.loads(
                (results / AGENTIC_DIR / f"{name}.json").read_text(encoding="utf-8")),
            "theirs": json.loads((out / f"{name}.json").read_text(encoding="utf-8")),
            "validated": validated, "export": result_dir / ARTIFACTS / EXPORT,
            "stdout": run.stdout, "junit": (root / "junit.xml").read_text(encoding="utf-8")}


@needs_tree
def test_inferencex_aggregates_the_plugins_files_as_the_plugin_does(
        agentic_point: dict[str, object]) -> None:
    assert _differences(agentic_point["ours"], agentic_point["theirs"]) == {}
    theirs = _leaves(agentic_point["theirs"])
    # What the comparison covered: real numbers, not empty blocks.
    assert isinstance(theirs["request_metrics.latency.intvty.p90"], float)
    assert theirs["request_metrics.throughput.per_gpu.total_tput_tps"] > 0  # type: ignore[operator]
    assert theirs["num_requests_successful"] == agentic_point["record"]["completed"]  # type: ignore[index]


@needs_tree
def test_the_servers_metrics_come_through_inferencex(agentic_point: dict[str, object]) -> None:
    """The SGLang server's counts of the point's tokens, its KV usage sampled during the point
    and its prefix-cache hit rate, read by InferenceX's SGLang adapter from the export."""
    record, theirs = agentic_point["record"], agentic_point["theirs"]
    assert isinstance(record, dict) and isinstance(theirs, dict)
    server = theirs["server_metrics"]
    assert server["present"] and server["adapter"] == "sglang" and "warnings" not in theirs
    # Every request of the point succeeded: the server counted what the client counted over
    # the profiling phase (the scrapes bracket it), the export's warmup requests excluded.
    sent = _sent_tokens(Path(str(agentic_point["export"])))
    assert (server["tokens"]["prompt_total"], server["tokens"]["generation_total"]) == (
        record["total_input_tokens"], record["total_output_tokens"])
    assert sent[0] > record["total_input_tokens"] > 0  # the warmup's are in the export only
    scraped = record["server_metrics"]
    assert scraped["kv_cache_usage_gauge"] == "sglang:token_usage"
    assert server["kv_cache"]["gpu_usage_pct"] == pytest.approx(
        scraped["kv_cache_usage_peak"], abs=1e-5)
    assert 0 < server["kv_cache"]["gpu_usage_pct"] <= 1
    assert server["cache"]["overall_cache_hit_rate"] == pytest.approx(
        scraped["gauges"]["sglang:cache_hit_rate"], abs=1e-5)
    assert 0 < server["cache"]["overall_cache_hit_rate"] < 1  # the replay re-sends history


@needs_tree
def test_inferencex_validator_accepts_the_aiperf_aggregate(
        agentic_point: dict[str, object]) -> None:
    validated = agentic_point["validated"]
    assert isinstance(validated, subprocess.CompletedProcess)
    assert validated.returncode == 0, validated.stderr
    assert "Validated aiperf request error rate: 0/" in validated.stdout


@needs_tree
def test_the_records_flat_keys_are_inferencex_numbers(agentic_point: dict[str, object]) -> None:
    record, theirs = agentic_point["record"], agentic_point["theirs"]
    assert isinstance(record, dict) and isinstance(theirs, dict)
    metrics = theirs["request_metrics"]
    pairs = {
        "agentic_tput_per_gpu": metrics["throughput"]["per_gpu"]["total_tput_tps"],
        "mean_qps": metrics["qps"]["mean"],
        "agentic_p90_intvty": metrics["latency"]["intvty"]["p90"],
    }
    assert {k: record[k] for k in pairs} == pytest.approx(pairs, rel=REL)
    assert record["submission_valid"] == 0  # a replay shorter than 900 s is never a submission
    assert any(str(r).startswith("unsafe_override") for r in record["invalid_reasons"])


@needs_tree
def test_e2e_normalized_interactivity_as_the_app_derives_it(
        agentic_point: dict[str, object]) -> None:
    """InferenceX-app: 1 / p90 of E2EL/OSL over profile_export.jsonl's profiled successes,
    the percentile InferenceX's own (`aggregation_common.percentile`)."""
    script = (
        "import json, sys\n"
        "from utils.agentic.aggregation.aggregation_common import percentile\n"
        "rows = [json.loads(l) for l in open(sys.argv[1])]\n"
        "r = [x['metrics']['request_latency']['value'] / 1000"
        " / x['metrics']['output_sequence_length']['value'] for x in rows if not x['error']"
        " and x['metadata']['benchmark_phase'] == 'profiling']\n"
        "print(1 / percentile(r, 90), len(r))\n")
    done = subprocess.run([sys.executable, "-c", script, str(agentic_point["export"])],
                          cwd=CURRENT, capture_output=True, text=True, timeout=60, check=True)
    value, count = done.stdout.split()
    record = agentic_point["record"]
    assert isinstance(record, dict)
    assert int(count) == record["completed"]
    assert record["p90_e2e_norm_intvty"] == pytest.approx(float(value), rel=REL)


AGENTIC_KEYS = ("p90_e2e_norm_intvty", "agentic_p90_intvty", "agentic_tput_per_gpu",
                "submission_valid")


@needs_tree
def test_an_agentic_point_reports_its_metrics(agentic_point: dict[str, object]) -> None:
    """Its table has the agentic columns, its JUnit properties the agentic numbers."""
    record = agentic_point["record"]
    assert isinstance(record, dict)
    header = next(line for line in str(agentic_point["stdout"]).splitlines()
                  if "ISL/OSL" in line)
    shown = [h for h, _ in columns([record])]
    assert "E2E-norm intvty p90" in shown and "intvty p90 (AgentX)" in shown
    assert all(h in header for h in shown)
    junit = str(agentic_point["junit"])
    for key in AGENTIC_KEYS:  # JUnit properties hold floats to 6 decimals
        value = round(record[key], 6) if isinstance(record[key], float) else record[key]
        assert f'<property name="{key}" value="{value}"' in junit


def test_a_fixed_length_table_has_no_agentic_column() -> None:
    shown = [h for h, _ in columns([{"tput_per_gpu": 100.0, "median_intvty": 20.0}])]
    assert "tput/GPU tok/s" in shown
    assert not {"E2E-norm intvty p90", "intvty p90 (AgentX)", "valid"} & set(shown)


def _records(count: int) -> list[RequestRecord]:
    """Requests a second apart, each of 20 tokens streamed 10 ms apart after a 50 ms TTFT."""
    return [RequestRecord(send_time=float(i), end_time=i + 0.24, input_tokens=1000 + i,
                          output_tokens=20, success=True,
                          chunk_times=i + 0.05 + 0.01 * np.arange(20, dtype=np.float64))
            for i in range(count)]


def _written(point: BenchPoint, records: list[RequestRecord], results: Path,
             server: dict[str, JSONValue] | None = None) -> PointRecord:
    meta = ReplayMeta(num_gpus=point.server.gpus, clock_start=0.0, start_unix=1_700_000_000.0,
                      duration_s=1800.0, hit_blocks=3, total_blocks=4)
    measurement = PointMeasurement(records=records, duration_s=31.0, num_prompts=len(records),
                                   max_concurrency=point.conc, simulated=True, replay=meta,
                                   server_metrics=server or {})
    record = build_result(point, measurement, spec=None, backend="external")
    return write_point_files(results, record, agentic_records=records).record


@needs_tree
@pytest.mark.parametrize("failed", [4, 30])
def test_failed_requests_are_judged_and_counted_as_inferencex_does(
        tmp_path: Path, failed: int) -> None:
    """Errors beyond InferenceX's 10 %: its validator rejects the point as the plugin's gate
    does, and its aggregate (accounting, empty metrics when nothing succeeded) is the
    plugin's."""
    point = next(p for s in load_recipe(write(tmp_path)).servers for p in s.points())
    records = [r if i >= failed else RequestRecord(
                   send_time=r.send_time, end_time=r.end_time, input_tokens=r.input_tokens,
                   output_tokens=0, success=False, error="HTTP 500: engine crashed")
               for i, r in enumerate(_records(30))]
    record = _written(point, records, tmp_path / "results")
    done = _inferencex(dict(record), tmp_path / "results", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    name = record.result_filename
    ours = json.loads((tmp_path / "results" / AGENTIC_DIR / f"{name}.json").read_text("utf-8"))
    theirs = json.loads((tmp_path / "out" / f"{name}.json").read_text(encoding="utf-8"))
    assert _differences(ours, theirs) == {}
    assert theirs["request_accounting"]["error_categories"] == {"HTTP 500": failed}
    validated = subprocess.run(
        [sys.executable, str(VALIDATOR), str(tmp_path / "results" / AGENTIC_DIR / name / ARTIFACTS),
         "--failed-request-threshold", "0.10"],
        cwd=CURRENT, capture_output=True, text=True, timeout=60, check=False)
    assert validated.returncode == 1
    assert f"{failed}/30" in validated.stderr
    block = record["agentic"]
    assert isinstance(block, dict)
    assert inferencex_failures(block["validity"])  # the plugin's gate says the same


@needs_tree
def test_every_agentic_shape_is_named_as_inferencex_names_it(tmp_path: Path) -> None:
    """Single node and disaggregated multinode, with and without DRAM offloading (a backend
    with its version), a KV transfer and a router: each point's result JSON is what
    InferenceX makes of its files in the job's environment."""
    servers = load_recipe(write(tmp_path)).servers
    points = [p for s in servers for p in s.points()]
    assert {p.server.multinode for p in points} == {True, False}
    for index, point in enumerate(points):
        results = tmp_path / f"results-{index}"
        record = _written(point, _records(30), results)
        out = tmp_path / f"out-{index}"
        done = _inferencex(dict(record), results, out)
        assert done.returncode == 0, (point.exp_name, done.stderr)
        name = record.result_filename
        ours = json.loads((results / AGENTIC_DIR / f"{name}.json").read_text(encoding="utf-8"))
        theirs = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
        assert _differences(ours, theirs) == {}, point.exp_name
        assert theirs["is_multinode"] == point.server.multinode
        assert theirs["kv_offloading"] == point.server.offloading


# What the scrapes of a point leave in its record (`loadgen/scrape.point_metrics`: counters as
# their increase over the point, gauges after it, the KV usage sampled during it) on a server
# with a CPU-DRAM KV tier: vLLM with its offload connector, SGLang with HiCache; and ATOM,
# which InferenceX's aggregation at this commit has no adapter for.
SCRAPED: dict[str, dict[str, JSONValue]] = {
    "vllm": {
        "counter_deltas": {
            "vllm:prompt_tokens_total": 90_000.0, "vllm:generation_tokens_total": 600.0,
            "vllm:prefix_cache_queries_total": 90_000.0,
            "vllm:prefix_cache_hits_total": 61_440.0,
            "vllm:external_prefix_cache_queries_total": 28_560.0,
            "vllm:external_prefix_cache_hits_total": 8_192.0,
            "vllm:kv_offload_bytes_gpu_to_cpu_total": 3.2e9,
            "vllm:kv_offload_bytes_cpu_to_gpu_total": 1.1e9,
            "vllm:kv_offload_time_gpu_to_cpu_total": 0.4,
            "vllm:kv_offload_time_cpu_to_gpu_total": 0.2},
        "gauges": {"vllm:kv_cache_usage_perc": 0.41, "vllm:num_requests_running": 0.0},
        "kv_cache_usage_gauge": "vllm:kv_cache_usage_perc", "kv_cache_usage_peak": 0.83,
        "kv_cache_usage_mean": 0.52},
    "sglang": {
        "counter_deltas": {
            "sglang:prompt_tokens_total": 90_000.0, "sglang:generation_tokens_total": 600.0,
            "sglang:cached_tokens_total": 70_000.0,
            'sglang:cached_tokens_total{cache_source="device"}': 61_000.0,
            'sglang:cached_tokens_total{cache_source="host"}': 9_000.0},
        "gauges": {"sglang:token_usage": 0.3, "sglang:cache_hit_rate": 0.7,
                   "sglang:hicache_host_used_tokens": 250_000.0,
                   "sglang:hicache_host_total_tokens": 1_000_000.0},
        "kv_cache_usage_gauge": "sglang:token_usage", "kv_cache_usage_peak": 0.9,
        "kv_cache_usage_mean": 0.6},
    "atom": {
        "counter_deltas": {"atom:prompt_tokens_total": 90_000.0},
        "gauges": {"atom:kv_cache_usage_ratio": 0.2},
        "kv_cache_usage_gauge": "atom:kv_cache_usage_ratio", "kv_cache_usage_peak": 0.5},
}


@needs_tree
@pytest.mark.parametrize("persona", sorted(SCRAPED))
def test_server_metrics_of_each_framework_as_inferencex_reads_them(
        tmp_path: Path, persona: str) -> None:
    """The point's server metrics, exported as AIPerf exports them: InferenceX's adapter makes
    of the export the plugin's `server_metrics` block, hit rates, KV usage and offload traffic
    included; a server it has no adapter for gets no export (an export it cannot read stops
    its aggregation), and both sides then say the export is missing."""
    point = next(p for s in load_recipe(write(tmp_path)).servers for p in s.points()
                 if p.exp_name == "qwen3.5_tp4_conc16_kvdram-hicache_spec-mtp")
    record = _written(point, _records(30), tmp_path / "results", SCRAPED[persona])
    done = _inferencex(dict(record), tmp_path / "results", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    name = record.result_filename
    ours = json.loads((tmp_path / "results" / AGENTIC_DIR / f"{name}.json").read_text("utf-8"))
    theirs = json.loads((tmp_path / "out" / f"{name}.json").read_text(encoding="utf-8"))
    assert _differences(ours, theirs) == {}
    server = theirs["server_metrics"]
    exported = tmp_path / "results" / AGENTIC_DIR / name / ARTIFACTS / SERVER_METRICS
    if persona == "atom":
        assert not exported.exists() and not server["present"]
        assert theirs["warnings"] == ["server_metrics_export.json missing or empty"]
        return
    assert server["adapter"] == persona and "warnings" not in theirs
    # The sampled peak, not the gauge's value at the end.
    assert server["kv_cache"]["gpu_usage_pct"] == SCRAPED[persona]["kv_cache_usage_peak"]
    assert server["tokens"]["prompt_total"] == 90_000
    cache = server["cache"]
    if persona == "vllm":
        assert cache["gpu_cache_hit_rate"] == round(61_440 / 90_000, 5)
        assert cache["cpu_cache_hit_rate"] == round(8_192 / 28_560, 5)
        assert server["kv_offload"]["bytes_gpu_to_cpu"] == 3.2e9
        assert server["kv_offload"]["bandwidth_cpu_to_gpu_bytes_per_second"] == 1.1e9 / 0.2
    else:
        assert cache["cached_tokens_by_source"] == {"device": 61_000, "host": 9_000}
        assert cache["overall_cache_hit_rate"] == round(70_000 / 90_000, 5)
        assert server["kv_cache"]["cpu_usage_pct"] == 0.25


@needs_tree
def test_a_point_simulated_in_process_exports_its_engines_counts(tmp_path: Path) -> None:
    """On the default backend nothing is scraped: the engine's counters stand in, under the
    names SGLang's server gives them, and InferenceX reads them as it reads a scrape."""
    write(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH"))
        if p)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--inferbench-no-plots",
         "--inferbench-replay-duration=1.5",
         "-m", "inferbench(exp_name='qwen3.5_tp4_conc16_kvdram-hicache_spec-mtp')"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    results = tmp_path / "inferbench-results"
    (raw,) = [p for p in (results / "points").glob("*.json") if not p.name.startswith("agg_")]
    record = point_record(json.loads(raw.read_text(encoding="utf-8")))
    done = _inferencex(record, results, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    name = str(record["result_filename"])
    ours = json.loads((results / AGENTIC_DIR / f"{name}.json").read_text(encoding="utf-8"))
    theirs = json.loads((tmp_path / "out" / f"{name}.json").read_text(encoding="utf-8"))
    assert _differences(ours, theirs) == {}
    server = theirs["server_metrics"]
    assert server["adapter"] == "sglang" and "warnings" not in theirs
    sent = _sent_tokens(results / AGENTIC_DIR / name / ARTIFACTS / EXPORT)
    assert (server["tokens"]["prompt_total"], server["tokens"]["generation_total"]) == sent
    tiers = record["server_metrics"]["kv_tiers"]  # type: ignore[index]
    assert server["cache"]["cached_tokens_by_source"] == {
        "device": tiers["hbm_hit_tokens"], "host": tiers["dram_hit_tokens"]}
    assert server["cache"]["gpu_cache_hit_rate"] > 0  # the replay re-sends each history
    assert server["kv_cache"]["cpu_total_tokens"] == tiers["host_tokens_total"] > 0
