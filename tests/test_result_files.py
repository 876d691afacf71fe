"""A point's two files in a real plugin run: raw lengths follow the workload options, the raw
file gives back the record (a results directory works as a baseline), and estimated token
counts are flagged on every table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_inferbench.options import parse_goodput
from pytest_inferbench.report.tables import (
    ESTIMATED_NOTE,
    NOT_TIMED_NOTE,
    markdown_tables,
    terminal_tables,
)
from pytest_inferbench.results.point_files import AGG_PREFIX, point_record
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[1]
RECIPE = master_entry(rows=["{ tp: 4, conc-list: [4] }"], isl=256, osl=32)


def run(pytester: pytest.Pytester, *options: str) -> dict[str, object]:
    """One point on the simulator; its raw file."""
    (pytester.path / "bench-master.yaml").write_text(RECIPE)
    if not (pytester.path / "launch").exists():
        shutil.copytree(REPO / "benchmarks" / "launch", pytester.path / "launch")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-no-plots",
                                           "--inferbench-prompts-per-conc", "5", *options)
    result.assert_outcomes(passed=1)
    points = pytester.path / "inferbench-results" / "points"
    (raw_path,) = [p for p in points.iterdir() if not p.name.startswith(AGG_PREFIX)]
    assert (points / f"{AGG_PREFIX}{raw_path.name}").is_file()
    text = raw_path.read_text()
    assert text.count("\n") == 1 and text.endswith("}\n")  # one line, as benchmark_serving.py
    raw: dict[str, object] = json.loads(text)
    return raw


def test_range_ratio_one_sends_fixed_lengths(pytester: pytest.Pytester) -> None:
    raw = run(pytester, "--inferbench-random-range-ratio", "1.0")
    assert raw["input_lens"] == [256] * 20 and raw["output_lens"] == [32] * 20
    workload = point_record(raw)["workload"]
    assert isinstance(workload, dict) and workload["random_range_ratio"] == 1.0
    assert workload["warmup"] == "same"


def test_default_range_ratio_varies_lengths_as_inferencex(pytester: pytest.Pytester) -> None:
    raw = run(pytester, "--inferbench-warmup", "distinct")
    inputs, outputs = raw["input_lens"], raw["output_lens"]
    assert isinstance(inputs, list) and isinstance(outputs, list)
    assert all(204 <= n <= 256 for n in inputs) and len(set(inputs)) > 1  # int(0.8 * 256)
    assert all(25 <= n <= 32 for n in outputs) and len(set(outputs)) > 1
    record = point_record(raw)
    assert record["workload"]["warmup"] == "distinct"  # type: ignore[index]
    assert record["simulated"] is True and record["server_node"] and record["config_key"]
    # The results directory (summary.json and the points' raw files) is a baseline.
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--inferbench-no-plots", "--inferbench-prompts-per-conc",
        "5", "--inferbench-warmup", "distinct",
        f"--inferbench-baseline={pytester.path / 'inferbench-results'}",
        "--inferbench-results", "second")
    result.assert_outcomes(passed=1)


def test_estimated_token_counts_are_flagged_on_every_table() -> None:
    row = {"server_node": "node-a", "isl": 1024, "osl": 1024, "conc": 4, "verdict": "passed",
           "token_counts_estimated": True}
    nodes = {"node-a": {"points": [row], "evals": []}}
    assert any(ESTIMATED_NOTE in line for line in terminal_tables(nodes))
    assert ESTIMATED_NOTE in markdown_tables(nodes, {"backend": "external"})
    row["token_counts_estimated"] = False
    assert not any(ESTIMATED_NOTE in line for line in terminal_tables(nodes))


def test_a_rate_limited_point_is_recorded_and_shown_as_one(pytester: pytest.Pytester) -> None:
    raw = run(pytester, "--inferbench-request-rate", "5", "--junitxml=junit.xml")
    assert raw["request_rate"] == 5.0  # vLLM's key: the configured rate, not "inf"
    record = point_record(raw)
    assert record["rate_limited"] is True
    # 20 requests at 5/s: the Poisson schedule's own rate is what the client achieved.
    assert 2.0 < record["achieved_request_rate"] < 12.0  # type: ignore[operator]
    assert 0 < record["achieved_concurrency"] <= 4  # type: ignore[operator]
    junit = (pytester.path / "junit.xml").read_text()
    assert '<property name="request_rate" value="5.0"' in junit
    assert '<property name="rate_limited" value="True"' in junit
    summary = json.loads((pytester.path / "inferbench-results" / "summary.json").read_text())
    (point,) = summary["points"]
    nodes = {"n": {"points": [point], "evals": []}}
    assert any(" 4 @5/s " in line for line in terminal_tables(nodes))
    assert "| 4 @5/s |" in markdown_tables(nodes, {"backend": "sim"})


def test_timings_that_are_not_meaningful_are_flagged_on_every_table() -> None:
    row = {"server_node": "node-a", "isl": 1024, "osl": 1024, "conc": 4, "verdict": "passed",
           "request_rate": "inf", "timings_meaningful": False, "time_scale": 0.0}
    nodes = {"node-a": {"points": [row], "evals": []}}
    assert any(NOT_TIMED_NOTE in line for line in terminal_tables(nodes))
    assert NOT_TIMED_NOTE in markdown_tables(nodes, {"backend": "sim-server"})
    assert any(line.split()[:2] == ["1024/1024", "4"] for line in terminal_tables(nodes))


def test_goodput_slos_fill_request_goodput(pytester: pytest.Pytester) -> None:
    raw = run(pytester, "--inferbench-goodput", "ttft:60000 tpot:1000")
    # Every request of a short simulated point meets SLOs this loose: goodput = throughput.
    assert raw["request_goodput:"] == pytest.approx(raw["request_throughput"])
    tight = run(pytester, "--inferbench-goodput", "ttft:0")
    assert tight["request_goodput:"] == 0.0


@pytest.mark.parametrize("text", ["ttft", "ttft:x", "itl:5", "tpot:-1"])
def test_bad_goodput_is_a_usage_error_naming_the_option(text: str) -> None:
    with pytest.raises(pytest.UsageError, match=f"--inferbench-goodput '{text}'"):
        parse_goodput(text)
    assert parse_goodput("ttft:2000  tpot:50") == (("ttft", 2000.0), ("tpot", 50.0))


def test_saved_requests_hold_one_line_per_request(pytester: pytest.Pytester) -> None:
    raw = run(pytester, "--inferbench-save-requests")
    path = (pytester.path / "inferbench-results" / "requests"
            / f"{point_record(raw)['result_filename']}.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == raw["num_prompts"] == 20
    assert [line["index"] for line in lines] == list(range(20))
    assert lines[0]["send_time_s"] == 0.0
    assert all(line["status"] == "ok" and line["error"] == "" for line in lines)
    assert [line["input_tokens"] for line in lines] == raw["input_lens"]
    assert [line["output_tokens"] for line in lines] == raw["output_lens"]
    for line in lines:
        # The chunks carry the output; n chunks have n - 1 gaps; E2EL is TTFT plus the gaps.
        assert sum(line["chunk_tokens"]) == line["output_tokens"]
        assert len(line["itl_ms"]) == len(line["chunk_tokens"]) - 1
        assert line["e2el_ms"] == pytest.approx(line["ttft_ms"] + sum(line["itl_ms"]), abs=1e-6)
    ttfts = sorted(line["ttft_ms"] for line in lines)
    assert (ttfts[9] + ttfts[10]) / 2 == pytest.approx(raw["median_ttft_ms"])


def test_a_request_rate_sweep_runs_each_point_once_per_rate(pytester: pytest.Pytester) -> None:
    (pytester.path / "bench-master.yaml").write_text(RECIPE)
    shutil.copytree(REPO / "benchmarks" / "launch", pytester.path / "launch")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-no-plots",
                                           "--inferbench-prompts-per-conc", "3", "-v",
                                           "--inferbench-request-rates", "2,inf")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*isl256-osl32-conc4-rate2 PASSED*",
                                 "*isl256-osl32-conc4-rateinf PASSED*"])
    points = pytester.path / "inferbench-results" / "points"
    raws = sorted(p for p in points.iterdir() if not p.name.startswith(AGG_PREFIX))
    rates = {p.stem.rsplit("_", 1)[1]: json.loads(p.read_text())["request_rate"] for p in raws}
    assert rates == {"rate2": 2.0, "rateinf": "inf"}
    result.stdout.fnmatch_lines(["* 4 @2/s *"])
    bad = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-request-rates",
                                        "2,0")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--inferbench-request-rates '2,0': '0' is not a rate > 0*"])


def test_a_speculative_point_s_files_hold_its_golden_acceptance_length(
        pytester: pytest.Pytester) -> None:
    # Known before any gate runs, so the files written before the gates already say it.
    (pytester.path / "bench-master.yaml").write_text(master_entry(
        rows=["{ tp: 4, spec-decoding: mtp, conc-list: [4] }"], isl=256, osl=32))
    shutil.copytree(REPO / "benchmarks" / "launch", pytester.path / "launch")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-no-plots",
                                           "--inferbench-prompts-per-conc", "2")
    result.assert_outcomes(passed=1)
    points = pytester.path / "inferbench-results" / "points"
    (raw_path,) = [p for p in points.iterdir() if not p.name.startswith(AGG_PREFIX)]
    record = point_record(json.loads(raw_path.read_text()))
    assert record["golden_acceptance_length"] == 2.83 and record["gate_failures"] == []
    assert isinstance(record["acceptance_length"], float) and record["acceptance_length"] > 1
    assert not [p for p in points.iterdir() if p.name.startswith(".")]  # no temp file left
