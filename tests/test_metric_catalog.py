"""The metric catalog: one declaration (and its computation) adds a metric end to end.

A time-to-second-token distribution is added to the catalog by a fixture and shows up in the
summary, the point's result JSON, the JUnit properties, the terminal table and the baseline
comparison (lower is better), while the InferenceX raw and agg files keep their keys.
"""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

# In-process pytester runs drop modules first imported during a run; numpy cannot be imported
# twice in one process, so the simulator is imported here, once.
import pytest_inferbench.backends.sim  # noqa: F401
from pytest_inferbench.gates.baseline import higher_is_better
from pytest_inferbench.gates.rules import RegressionPolicy
from pytest_inferbench.report import result_properties
from pytest_inferbench.report.tables import columns
from pytest_inferbench.results import catalog, metric_kinds
from pytest_inferbench.results.agentic import ReplayMeta
from pytest_inferbench.results.build import agentic_fields
from pytest_inferbench.results.metric_kinds import FloatArray
from pytest_inferbench.results.metrics import RequestRecord, summarize
from pytest_inferbench.results.point_files import AGG_PREFIX, agg_result, raw_keys
from pytest_inferbench.results.power import AGG_KEYS as POWER_KEYS
from pytest_inferbench.results.record import JSONValue
from pytest_inferbench.results.request_records import Flat
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[1]
ISL, OSL, CONC = 256, 16, 2
NODES = 2  # plain and MTP, one point each
RECIPE = master_entry(rows=[f"{{ tp: 4, conc-list: [{CONC}] }}",
                            f"{{ tp: 4, spec-decoding: mtp, conc-list: [{CONC}] }}"],
                      isl=ISL, osl=OSL)
RUN = ("-p", "no:cacheprovider", "--inferbench-no-plots", "--inferbench-prompts-per-conc", "3")
HEADER = "TTST p50 s"


def second_token_samples(flat: Flat) -> FloatArray:
    """Per request: when the chunk holding its second token arrived, after its send (requests
    of one token have none)."""
    starts = np.cumsum(flat.chunk_count) - flat.chunk_count
    first_tokens = flat.tokens[starts] if flat.tokens is not None else np.ones_like(starts)
    at = np.where(first_tokens >= 2, 0, 1)  # a first chunk of two tokens holds the second
    has = at < flat.chunk_count
    if flat.times is not None:
        arrival = flat.times[(starts + at)[has]]
    else:  # the simulator's chunks arrive at its step ends
        assert flat.step_ends is not None and flat.first_steps is not None
        arrival = flat.step_ends[(flat.first_steps + at)[has]]
    samples: FloatArray = arrival - flat.send[has]
    return samples


TTST = catalog.latency(
    "ttst", "time to second token: the chunk holding the second token - send",
    samples=second_token_samples, junit=("median_ttst",),
    columns=(metric_kinds.Column(HEADER, "median_ttst", digits=3),), baseline=("median_ttst",))


@pytest.fixture
def with_ttst(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog, "CATALOG", (*catalog.CATALOG, TTST))


def expected_ttst(records: list[RequestRecord]) -> list[float]:
    """TTST of each record read from its own chunks (seconds), the second token found by a
    running count of the chunks' tokens."""
    out = []
    for r in records:
        if not r.success:
            continue
        holding = int(np.searchsorted(np.cumsum(r.tokens_per_chunk()), 2))
        if holding < len(r.chunk_times):
            out.append(float(r.chunk_times[holding]) - r.send_time)
    return out


def test_summarize_reads_every_metric_of_the_catalog() -> None:
    """What summarize writes is what the catalog declares (the AL keys come from the server,
    the power keys from the backend's power reading, an agentic point's own from its
    aggregate)."""
    summary = summarize([], duration_s=1.0, num_prompts=0, max_concurrency=1, num_gpus=1)
    server_side = {"acceptance_length", "client_tokens_per_chunk", *POWER_KEYS,
                   "client_minus_server_median_ttft_ms", "client_minus_server_median_itl_ms"}
    meta = ReplayMeta(num_gpus=1, clock_start=0.0, start_unix=0.0, duration_s=1.0)
    agentic = set(agentic_fields([], meta)) - {"agentic", "invalid_reasons"}
    assert set(summary) | server_side | agentic == set(catalog.all_record_keys())


def test_a_declared_distribution_is_computed_and_described(with_ttst: None) -> None:
    rng = np.random.default_rng(3)
    records = []
    for i in range(40):
        chunks = int(rng.integers(1, 6))
        times = i * 0.1 + 0.02 + np.cumsum(rng.uniform(0.005, 0.05, chunks))
        tokens = rng.integers(1, 4, chunks) if i % 2 else np.zeros(0, np.int64)
        out_tokens = int(tokens.sum()) if tokens.size else chunks
        records.append(RequestRecord(i * 0.1, float(times[-1]), 64, out_tokens, i % 9 != 4,
                                     times, tokens))
    summary = summarize(records, duration_s=5.0, num_prompts=len(records), max_concurrency=4,
                        num_gpus=1)
    samples = np.array(expected_ttst(records))
    assert summary["mean_ttst_ms"] == pytest.approx(samples.mean() * 1000)
    assert summary["median_ttst_ms"] == pytest.approx(np.median(samples) * 1000)
    assert summary["p99_ttst_ms"] == pytest.approx(np.percentile(samples, 99) * 1000)
    assert summary["median_ttst"] == pytest.approx(np.median(samples))  # in seconds too

    described = catalog.describe("median_ttst")
    assert described is not None and described.unit == "s" and described.metric.timing
    assert catalog.unit_of("p99_ttst_ms") == "ms"
    assert higher_is_better("median_ttst") is False
    assert ("median_ttst", False) in catalog.baseline_metrics()
    assert HEADER in [header for header, _ in columns()]
    properties = dict(result_properties(summary))
    assert properties["median_ttst"] == round(float(np.median(samples)), 6)


def test_the_agg_file_derives_its_keys_as_the_summary_does() -> None:
    """Seconds, interactivity and per-GPU throughputs have one derivation: the agg file's equal
    the summary's. A TPOT statistic of 0 (one request: no spread) is null interactivity in the
    summary and no agg file, as InferenceX's process_result.py divides by zero there."""
    tp = 2
    env = {"RUNNER_TYPE": "mi355x", "IMAGE": "image", "MODEL_PREFIX": "m",
           "FRAMEWORK": "atom", "PRECISION": "fp4", "SPEC_DECODING": "none", "DISAGG": "false",
           "ISL": "8", "OSL": "5", "TP": str(tp), "PP_SIZE": "1", "DCP_SIZE": "1",
           "PCP_SIZE": "1", "EP_SIZE": "1", "DP_ATTENTION": "false"}
    identity: dict[str, JSONValue] = {"inferencex_env": env}

    def summary_and_raw(records: list[RequestRecord]) -> tuple[Mapping[str, JSONValue],
                                                                dict[str, JSONValue]]:
        summary = summarize(records, duration_s=1.0, num_prompts=len(records),
                            max_concurrency=len(records), num_gpus=tp)
        raw: dict[str, JSONValue] = {key: summary[key] for key in raw_keys() if key in summary}
        raw.update({"model_id": "model", "inferbench": identity})
        return summary, raw

    summary, raw = summary_and_raw([
        RequestRecord(0.0, 0.5, 8, 5, True, np.linspace(0.1, 0.5, 5)),
        RequestRecord(0.0, 0.9, 8, 5, True, np.linspace(0.1, 0.9, 5))])
    agg = agg_result(raw)
    derived = {key: value for key, value in agg.items() if catalog.describe(key)}
    assert "std_intvty" in derived and "tput_per_gpu" in derived
    assert derived == {key: summary[key] for key in derived}
    one, one_raw = summary_and_raw([RequestRecord(0.0, 0.5, 8, 5, True,
                                                  np.linspace(0.1, 0.5, 5))])
    assert one["std_tpot_ms"] == 0.0 and one["std_intvty"] is None
    with pytest.raises(ZeroDivisionError):
        agg_result(one_raw)


def test_a_new_distribution_leaves_the_inferencex_files_alone(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Not declared an InferenceX key, a new distribution is no raw-file key."""
    before = raw_keys()
    monkeypatch.setattr(catalog, "CATALOG", (*catalog.CATALOG, TTST))
    assert raw_keys() == before


def test_a_key_shown_must_be_the_metrics_own(monkeypatch: pytest.MonkeyPatch) -> None:
    stray = catalog.latency("ttst", "time to second token", samples=second_token_samples,
                            junit=("median_ttft",))
    monkeypatch.setattr(catalog, "CATALOG", (*catalog.CATALOG, stray))
    with pytest.raises(ValueError, match="metric ttst: median_ttft is none of its keys"):
        catalog.junit_properties()


def declared_inferencex_keys() -> tuple[set[str], set[str]]:
    """(raw file, agg file) metric keys as the catalog declares them: a raw distribution's ms
    statistics are raw-file keys, its seconds ones agg-file keys."""
    raw: set[str] = set()
    agg: set[str] = set()
    for key in catalog.all_record_keys():
        found = catalog.describe(key)
        assert found is not None
        where = found.metric.inferencex
        if where == "raw" and found.metric.distribution and not key.endswith("_ms"):
            where = "agg"
        {"raw": raw, "agg": agg, "": set()}[where].add(key)
    return raw, agg


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    (pytester.path / "bench-master.yaml").write_text(RECIPE)
    shutil.copytree(REPO / "benchmarks" / "launch", pytester.path / "launch")
    return pytester


def request_ttst(lines: list[dict[str, object]]) -> list[float]:
    """TTST (ms) of each request of a point's `--inferbench-save-requests` lines: chunk
    arrivals are its TTFT plus its running ITLs."""
    out = []
    for line in lines:
        gaps, tokens = line["itl_ms"], line["chunk_tokens"]
        assert isinstance(gaps, list) and isinstance(tokens, list)
        arrivals = np.cumsum([line["ttft_ms"], *gaps])
        holding = int(np.searchsorted(np.cumsum(tokens), 2))
        if holding < len(arrivals):
            out.append(float(arrivals[holding]))
    return out


def test_a_new_metric_reaches_the_result_junit_table_and_baseline(
        project: pytest.Pytester, with_ttst: None) -> None:
    inferencex_raw = set(raw_keys())
    declared_raw, declared_agg = declared_inferencex_keys()
    result = project.runpytest(*RUN, "--inferbench-save-requests", "--junitxml=junit.xml",
                               "--inferbench-save-baseline=base.json")
    result.assert_outcomes(passed=NODES)

    # The result JSON: the distribution under the raw file's namespace, computed as the
    # requests' own chunk times say; the InferenceX keys of both files unchanged.
    results = project.path / "inferbench-results"
    records = {}
    for raw_path in (results / "points").glob("*.json"):
        if raw_path.name.startswith(AGG_PREFIX):
            continue
        raw = json.loads(raw_path.read_text())
        record = raw["inferbench"]
        assert set(raw) - {"inferbench"} == inferencex_raw
        agg = json.loads((raw_path.parent / f"{AGG_PREFIX}{raw_path.name}").read_text())
        assert not [key for key in agg if "ttst" in key]
        # What the catalog says InferenceX has is what the files hold.
        assert {key for key in raw if catalog.describe(key)} == declared_raw
        assert {key for key in agg if catalog.describe(key)} == declared_agg
        lines = [json.loads(text) for text in
                 (results / "requests" / f"{raw_path.stem}.jsonl").read_text().splitlines()]
        assert record["median_ttst_ms"] == pytest.approx(np.median(request_ttst(lines)))
        assert record["median_ttst"] == pytest.approx(record["median_ttst_ms"] / 1000)
        records[record["server_node"]] = record
    assert len(records) == NODES

    # JUnit: a property of each point's testcase, after the catalog's earlier ones.
    cases = list(ET.parse(project.path / "junit.xml").getroot().iter("testcase"))
    assert len(cases) == NODES
    for case in cases:
        names = [p.get("name") for p in case.iter("property")]
        values = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert names[-1] == "median_ttst"
        node = str(values["server_node"])
        assert float(str(values["median_ttst"])) == pytest.approx(
            records[node]["median_ttst"], abs=1e-6)

    # The terminal table: a column of its own, before the verdict.
    result.stdout.re_match_lines([rf"\s*ISL/OSL\s+.*AL \(golden\)\s+.*{HEADER}\s+verdict"])
    for record in records.values():
        result.stdout.re_match_lines([rf"\s*{ISL}/{OSL}\s+{CONC}\s+.*"
                                      rf"\s{record['median_ttst']:.3f}\s+passed"])

    # The baseline: compared by default, lower is better.
    baseline = json.loads((project.path / "base.json").read_text())
    for point in baseline["points"]:
        point["median_ttst"] *= 2  # the baseline was slower: now is better
    (project.path / "base.json").write_text(json.dumps(baseline))
    project.runpytest(*RUN, "--inferbench-baseline=base.json").assert_outcomes(passed=NODES)
    slower = 2.0  # now takes twice the baseline's time
    for point in baseline["points"]:
        point["median_ttst"] /= 2 * slower
    (project.path / "base.json").write_text(json.dumps(baseline))
    worse = project.runpytest(*RUN, "--inferbench-baseline=base.json")
    worse.assert_outcomes(failed=NODES)
    change = re.escape(f"{slower - 1:+.1%}")
    tolerance = f"{RegressionPolicy().default_tolerance:.0%}"
    worse.stdout.re_match_lines([rf".*median_ttst [\d.]+ s > baseline [\d.]+ s \({change}, "
                                 rf"tolerance {tolerance}; base\.json\)"])
