"""Agentic-coding points run on the sim-server backend: the trace replay over real HTTP, the
point's files written through the usual path, the traces' source said in the result and the
table; the default `sim` backend replays them in process on its virtual clock; dram-offload
points skip, saying what is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_agentic_entries import write

CORPUS = Path("/work/shared/data/agentic/traces.jsonl")
# In a subprocess: a sim-server run's httpx must be the one its `except` clauses name, and
# pytester's in-process runs forget and re-import modules.
FAST = ("-p", "no:cacheprovider", "-rs", "--inferbench-backend=sim-server",
        "--inferbench-time-scale=0", "--inferbench-replay-duration=0.5", "--inferbench-no-plots")
TP8_CONC4 = ("-m", "inferbench(exp_name='qwen3.5_tp8_conc4_kvnone_spec-mtp')")


def _point(pytester: pytest.Pytester) -> dict[str, object]:
    files = [p for p in (pytester.path / "inferbench-results" / "points").glob("*.json")
             if not p.name.startswith("agg_")]
    assert len(files) == 1, files
    data = json.loads(files[0].read_text(encoding="utf-8"))
    # vLLM's result keys at the top, the rest of the record under `inferbench`.
    return {**data, **data["inferbench"]}


def test_an_agentic_point_replays_synthetic_traces_on_sim_server(
    pytester: pytest.Pytester,
) -> None:
    write(pytester.path)
    result = pytester.runpytest_subprocess(*FAST, *TP8_CONC4)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*traces:synthetic*passed*"])  # the table's point column
    point = _point(pytester)
    assert point["exp_name"] == "qwen3.5_tp8_conc4_kvnone_spec-mtp"
    workload = point["workload"]
    assert isinstance(workload, dict)
    assert workload["kind"] == "agentic-replay"
    assert str(workload["traces"]).startswith("synthetic (seed 0")
    assert workload["lanes"] == 4 and workload["plays"] >= 4
    assert point["completed"] == point["num_prompts"] > 0
    assert 0 < workload["theoretical_cache_hit_rate"] < 1
    agg = list((pytester.path / "inferbench-results" / "points").glob("agg_*.json"))
    assert len(agg) == 1


@pytest.mark.skipif(not CORPUS.exists(), reason="the shared agentic corpus is not here")
def test_traces_option_replays_that_file(pytester: pytest.Pytester) -> None:
    write(pytester.path)
    result = pytester.runpytest_subprocess(*FAST, *TP8_CONC4, f"--inferbench-traces={CORPUS}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*traces:traces.jsonl*passed*"])
    workload = _point(pytester)["workload"]
    assert isinstance(workload, dict)
    assert workload["traces"] == str(CORPUS) and workload["trace_count"] == 3


def test_a_bad_traces_file_fails_the_point_saying_file_and_line(
    pytester: pytest.Pytester,
) -> None:
    write(pytester.path)
    bad = pytester.path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n', encoding="utf-8")
    result = pytester.runpytest_subprocess(*FAST, *TP8_CONC4, f"--inferbench-traces={bad}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{bad}:1: <trace>.models: missing required key*"])
    assert "Traceback" not in result.stdout.str()


def test_dram_points_skip_on_sim_server_and_on_sim(pytester: pytest.Pytester) -> None:
    write(pytester.path)
    for backend in ("sim-server", "sim"):
        result = pytester.runpytest_subprocess(*FAST, f"--inferbench-backend={backend}", "-k",
                                               "qwen3.5", "-m", "inferbench(kv_offloading='dram')")
        result.assert_outcomes(skipped=1)
        result.stdout.fnmatch_lines(["*kv-offloading dram is not simulated yet (missing: a "
                                     "CPU-DRAM KV-offload tier in the simulator)*"])


def test_an_agentic_point_replays_in_process_on_the_default_backend(
    pytester: pytest.Pytester,
) -> None:
    write(pytester.path)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "--inferbench-no-plots",
                                "--inferbench-replay-duration=120", *TP8_CONC4)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*[[]SIMULATED:*", "*traces:synthetic*passed*"])
    point = _point(pytester)
    assert point["backend"] == "sim" and point["simulated"] is True
    workload = point["workload"]
    assert isinstance(workload, dict)
    assert workload["kind"] == "agentic-replay"
    assert str(workload["traces"]).startswith("synthetic (seed 0")
    assert workload["lanes"] == 4 and workload["plays"] >= 4 and workload["duration_s"] == 120
    assert point["completed"] == point["num_prompts"] > 0
    assert 0 < workload["theoretical_cache_hit_rate"] < 1
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest("-p", "no:cacheprovider", "--inferbench-no-plots",
                                "--inferbench-replay-duration=120", f"--junitxml={junit}",
                                *TP8_CONC4)
    result.assert_outcomes(passed=1)
    assert 'name="agentic_traces" value="synthetic' in junit.read_text(encoding="utf-8")


@pytest.mark.parametrize("value", ["0", "inf"])
def test_a_replay_duration_out_of_range_is_a_usage_error(pytester: pytest.Pytester,
                                                         value: str) -> None:
    write(pytester.path)
    result = pytester.runpytest("-p", "no:cacheprovider", "--inferbench-backend=sim-server",
                                f"--inferbench-replay-duration={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*replay duration*expected a finite number of seconds > 0*"])


def test_an_agentic_point_replays_against_an_external_server(pytester: pytest.Pytester,
                                                             tmp_path: Path) -> None:
    from pytest_inferbench.sim.server.launcher import launch

    write(pytester.path)
    server = launch(("vllm", "serve", "Qwen/Qwen3.5-397B-A17B-FP8", "--tensor-parallel-size",
                     "8"), ("--hardware", "B200", "--time-scale", "0"), log_dir=tmp_path)
    try:
        server.wait_healthy(timeout_s=60)
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "--inferbench-backend=external",
            f"--inferbench-base-url={server.base_url}", "--inferbench-replay-duration=0.5",
            "--inferbench-no-plots", *TP8_CONC4)
    finally:
        server.stop()
    result.assert_outcomes(passed=1)
    point = _point(pytester)
    assert point["backend"] == "external" and point["completed"] == point["num_prompts"] > 0
