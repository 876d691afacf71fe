"""The framework registry (`frameworks/registry.py`): a framework is one entry, and every entry
runs end to end: collected from a recipe, run on the simulator, its server metrics exposed by
the simulated HTTP server under its persona's names and read back by the client's scraper."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

import pytest
import yaml

from pytest_inferbench.frameworks import registry, specdecode
from pytest_inferbench.results.point_files import AGG_PREFIX, point_record
from pytest_inferbench.sim import catalog
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.testing.recipes import master_entry

if TYPE_CHECKING:
    from collections.abc import Iterator

QUANTITIES = Path(registry.__file__).parents[1] / "sim" / "server" / "quantities.yaml"
ROWS, ISL, OSL = ["{ tp: 4, conc-list: [2] }"], 64, 8  # one tiny point per framework
RUN_OPTIONS = ("-p", "no:cacheprovider", "--inferbench-no-plots", "--inferbench-prompts-per-conc",
               "2", "--inferbench-time-scale", "0")

# A framework the package does not ship, as a project would add one: its whole entry.
THROWAWAY = "tinyserve"
THROWAWAY_ENTRY = f"""
name: {THROWAWAY}
order: 90
argv_words: [{THROWAWAY}]
programs: [{THROWAWAY}]
persona: {THROWAWAY}
metrics:
  running: "{THROWAWAY}:running"
  kv_usage: "{THROWAWAY}:kv_usage"
  generation_tokens: "{THROWAWAY}:generated"
  preemptions: "{THROWAWAY}:preempted"
speculative: {{flags: [draft-tokens], synthetic_acceptance: []}}
multinode: {{{THROWAWAY}-disagg: random}}
simulator:
  step_overhead_ms: 2.5
  allreduce_bytes_per_elem: 2.0
  hbm_efficiency: 0.8
  compute_efficiency: 0.0945
  calibrated_on: MI355X
  defaults: {{max_num_seqs: 64, max_num_batched_tokens: 4096, block_size: 16,
             gpu_memory_utilization: 0.9, kv_cache_dtype: auto}}
  kv_transfer: {{overlap: false, latency_ms: 1.0, efficiency: 0.8}}
"""


def launch_spec(program: str) -> str:
    """A launch spec that starts `program` the way every registered program takes a model."""
    return textwrap.dedent(f"""\
        command: [{program}, serve, '{{model}}']
        args: [--port, '{{port}}', --tensor-parallel-size, '{{tp}}']
        port: 8888
        health-path: /health
        startup-timeout: 120
        client: {{use-chat-template: false, endpoint: /v1/completions}}
        """)


def write_recipes(root: Path, programs: dict[str, str]) -> None:
    """One entry per framework (MiniMax-M3 MXFP4 on MI355X) and its launch spec, which starts
    the framework's program."""
    (root / "launch").mkdir(exist_ok=True)
    entries = []
    for name, program in programs.items():
        entries.append(master_entry(f"minimaxm3-fp4-mi355x-{name}", framework=name, rows=ROWS,
                                    isl=ISL, osl=OSL))
        (root / "launch" / f"minimaxm3_fp4_mi355x_{name}.yaml").write_text(launch_spec(program))
    (root / "bench-master.yaml").write_text("".join(entries))


def raw_records(root: Path) -> dict[str, dict[str, Any]]:
    """Each point's raw file by its framework."""
    points = root / "inferbench-results" / "points"
    records = {}
    for path in points.iterdir():
        if not path.name.startswith(AGG_PREFIX):
            raw = json.loads(path.read_text())
            records[str(point_record(raw)["framework"])] = raw
    return records


@pytest.fixture
def throwaway() -> Iterator[registry.FrameworkEntry]:
    found = registry.register(yaml.safe_load(THROWAWAY_ENTRY))
    yield found
    registry.unregister(THROWAWAY)


def test_a_framework_is_one_entry_that_every_part_asks(throwaway: registry.FrameworkEntry) -> None:
    assert THROWAWAY in registry.names() and THROWAWAY in registry.personas()
    assert registry.of_argv([THROWAWAY, "serve", "m"]) is throwaway
    assert registry.engine_of(f"{THROWAWAY}-disagg") == THROWAWAY
    assert registry.default_router(f"{THROWAWAY}-disagg") == throwaway.multinode[
        f"{THROWAWAY}-disagg"]
    assert catalog.framework(THROWAWAY).step_overhead_s == pytest.approx(
        throwaway.simulator["step_overhead_ms"] / 1e3)
    assert throwaway.preemption_counter == f"{throwaway.metrics['preemptions']}_total"
    registry.unregister(THROWAWAY)
    with pytest.raises(registry.FrameworkError, match=f"unknown framework '{THROWAWAY}'"):
        registry.get(THROWAWAY)


def test_an_entry_missing_a_key_names_it() -> None:
    data = yaml.safe_load(THROWAWAY_ENTRY)
    del data["simulator"]
    with pytest.raises(registry.FrameworkError, match="missing simulator"):
        registry.entry(data)


def test_a_registered_framework_runs_a_point_on_the_simulator(pytester: pytest.Pytester) -> None:
    """The project's conftest registers the framework: one entry, plus its launch spec."""
    (pytester.path / f"{THROWAWAY}.yaml").write_text(THROWAWAY_ENTRY)
    pytester.makeconftest(f"""
        from pathlib import Path

        import yaml

        from pytest_inferbench.frameworks import registry, specdecode

        registry.register(yaml.safe_load(Path(__file__).with_name("{THROWAWAY}.yaml").read_text()))
        """)
    write_recipes(pytester.path, {THROWAWAY: THROWAWAY, "vllm": "vllm"})
    result = pytester.runpytest_subprocess(*RUN_OPTIONS)
    result.assert_outcomes(passed=2)
    records = raw_records(pytester.path)
    ours, theirs = records[THROWAWAY], records["vllm"]
    assert point_record(ours)["simulated"] is True
    assert ours["completed"] == len(ours["output_lens"])
    # The same workload on both: every decode step differs by the profiles' step overheads
    # alone (conc 2 stays below both batch limits), so each token's time does too.
    assert ours["input_lens"] == theirs["input_lens"]
    overhead_ms = (registry.get("vllm").simulator["step_overhead_ms"]
                   - yaml.safe_load(THROWAWAY_ENTRY)["simulator"]["step_overhead_ms"])
    assert theirs["mean_tpot_ms"] - ours["mean_tpot_ms"] == pytest.approx(
        overhead_ms, abs=1e-6)


def exposed(persona: registry.FrameworkEntry) -> tuple[set[str], set[str]]:
    """The counter (as scraped, `_total`) and gauge names a plain-decoding server without a
    CPU-DRAM KV tier exposes."""
    counters, gauges = set(), set()
    for quantity in yaml.safe_load(QUANTITIES.read_text()):
        name = persona.metrics.get(quantity["snapshot"])
        if name is None or quantity.get("speculative") or quantity.get("offload"):
            continue
        if quantity["kind"] == "counter":
            counters.add(f"{name}_total")
        else:
            gauges.add(name)
    return counters, gauges


def test_every_framework_runs_on_the_simulated_server_and_its_metrics_are_scraped(
        pytester: pytest.Pytester) -> None:
    names = registry.names()
    write_recipes(pytester.path, {name: registry.get(name).programs[0] for name in names})
    result = pytester.runpytest_subprocess(*RUN_OPTIONS, "--inferbench-backend", "sim-server",
                                           "--junitxml=junit.xml")
    result.assert_outcomes(passed=len(names))
    records = raw_records(pytester.path)
    assert sorted(records) == names
    junit = ElementTree.parse(pytester.path / "junit.xml")
    properties = {case.get("classname", ""): {p.get("name") for p in case.iter("property")}
                  for case in junit.iter("testcase")}
    for name, raw in records.items():
        persona = registry.get(registry.get(name).persona)
        # A persona with latency histograms: the server's view over the point, compared with
        # the client's in the record and in its JUnit properties.
        record = point_record(raw)
        histograms = record["server_metrics"].get("latency_histograms")  # type: ignore[union-attr]
        assert bool(histograms) == bool(persona.latency_histograms), name
        if histograms:
            assert "median_ttft_ms" in record["client_vs_server_ms"], name  # type: ignore[operator]
            assert any("client_minus_server_median_ttft_ms" in props
                       for node, props in properties.items() if f"-{name}-" in node), name
        counters, gauges = exposed(persona)
        server: dict[str, Any] = point_record(raw)["server_metrics"]  # type: ignore[assignment]
        assert set(server["counter_deltas"]) >= counters and counters, name
        assert set(server["gauges"]) >= gauges and gauges, name
        generated = f"{persona.metrics['generation_tokens']}_total"
        assert server["counter_deltas"][generated] == sum(raw["output_lens"]), name
        # KV usage is sampled during the load, under the persona's gauge name (a point this
        # short may end before the first sample).
        sampled = server["kv_cache_usage_samples"]
        assert server["kv_cache_usage_gauge"] == (persona.metrics["kv_usage"] if sampled
                                                  else None), name
        assert server["preemptions"] == server["counter_deltas"][persona.preemption_counter], name


MODEL = "amd/MiniMax-M3-MXFP4"


@pytest.mark.parametrize("name", registry.names())
def test_data_parallel_reads_as_the_entry_says(name: str) -> None:
    entry = registry.get(name)
    argv = [entry.programs[0], "serve", MODEL, "--tensor-parallel-size", "2",
            "--data-parallel-size", "2"]
    config, ignored = engine_config_from_argv(argv, hardware="MI355X", framework=name)
    if entry.data_parallel_attention:
        assert (config.tp, config.dp_attn) == (2 * 2, True)
    else:
        assert (config.tp, config.dp_attn) == (2, False)
        assert any(word.startswith("--data-parallel-size 2") for word in ignored)


@pytest.mark.parametrize("name", registry.names())
def test_an_options_file_is_read_only_where_the_entry_says(name: str) -> None:
    entry = registry.get(name)
    batch = catalog.framework(name).defaults_on(catalog.hardware("MI355X"))["max_num_seqs"] + 1
    config, ignored = engine_config_from_argv(
        [entry.programs[0], "serve", MODEL, "--config", "options.yaml"], hardware="MI355X",
        framework=name, files={"options.yaml": f"max_batch_size: {batch}\n"})
    if entry.options_file:
        assert config.max_num_seqs == batch and not ignored
    else:
        assert config.max_num_seqs == batch - 1 and ignored == ["--config options.yaml"]


def test_an_unknown_speculative_reader_is_named(throwaway: registry.FrameworkEntry) -> None:
    data = {**yaml.safe_load(THROWAWAY_ENTRY), "speculative": {"reader": "nope"}}
    registry.register(data)
    with pytest.raises(registry.FrameworkError, match=r"speculative\.reader 'nope' unknown"):
        specdecode.read_speculative_decoding(["vllm", "serve", MODEL])



# How each family reader's knobs force acceptance: (argv words, env) beside a plain MTP argv.
FORCING: dict[str, tuple[list[str], dict[str, str]]] = {
    "atom": (["--spec-decode-acceptance-length", "2.5"], {}),
    "vllm": (["--speculative-config", json.dumps(
        {"method": "eagle3", "num_speculative_tokens": 3,
         "rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5})],
        {}),
    "sglang": ([], {"SGLANG_SIMULATE_ACC_LEN": "2.5"}),
    "trtllm": ([], {"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS": "1.5"}),
}


@pytest.mark.parametrize("name", registry.names())
def test_an_entry_lists_the_knobs_that_force_its_acceptance(name: str) -> None:
    entry = registry.get(name)
    assert entry.speculative_reader in FORCING
    words, env = FORCING[str(entry.speculative_reader)]
    argv = [entry.programs[0], "serve", MODEL, "--method", "mtp", "--num-speculative-tokens",
            "3", *words]
    described = specdecode.read_speculative_decoding(argv, env)
    assert described is not None and described.forced_acceptance_length == 2.5
    assert described.forced_by and described.forced_by in entry.synthetic_acceptance
