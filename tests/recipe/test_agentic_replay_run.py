"""Agentic-coding points run on the sim-server backend: the trace replay over real HTTP, the
point's files written through the usual path, the traces' source said in the result and the
table; the default `sim` backend replays them in process on its virtual clock; a dram-offload
point runs with the simulator's CPU-DRAM tier on sim-server and skips on sim, saying what is
missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from shared_data import CORPUS
from test_agentic_entries import write

from pytest_inferbench.sim.power import gpu_power

# In a subprocess: a sim-server run's httpx must be the one its `except` clauses name, and
# pytester's in-process runs forget and re-import modules.
FAST = ("-p", "no:cacheprovider", "-rs", "--inferbench-backend=sim-server",
        "--inferbench-time-scale=0", "--inferbench-replay-duration=0.5", "--inferbench-no-plots")
B200 = gpu_power("B200")  # the runner of the TP8 point
TP8_CONC4 = ("-m", "inferbench(exp_name='qwen3.5_tp8_conc4_kvnone_spec-mtp')")


def _point(pytester: pytest.Pytester) -> dict[str, Any]:
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


def _assert_one_energy(point: dict[str, Any]) -> None:
    """The power model's figures, one energy: mean power x GPUs x the measured duration, per
    token from the point's measured token counts (the warmup's are in none of them)."""
    assert point["power_valid"] == 1, point.get("power_invalid_reason")
    assert point["power_source"] == "simulated" and point["power_num_gpus"] == 8
    watts, energy = float(point["avg_power_w"]), float(point["total_gpu_energy_j"])
    assert B200.idle_w < watts <= B200.tdp_w
    # rel 1e-5: the record rounds the watts to 3 decimals and the joules per token to 6.
    assert energy == pytest.approx(watts * 8 * float(point["duration"]), rel=1e-5)
    out = int(point["total_output_tokens"])
    total = int(point["total_input_tokens"]) + out
    assert point["joules_per_output_token"] == pytest.approx(energy / out, rel=1e-5)
    assert point["joules_per_total_token"] == pytest.approx(energy / total, rel=1e-5)


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
    # AgentX's aggregate has what the replay knows: the theoretical hits and recorded lengths.
    metrics = point["agentic"]["request_metrics"]
    assert metrics["cache"]["theoretical_cache_hit_rate"] == pytest.approx(
        workload["theoretical_cache_hit_rate"])
    assert metrics["tokens"]["output_expected"] == metrics["tokens"]["output_actual"]
    # Each lane's first tree starts at its t*: its primers and warmups are counted by nothing.
    assert point["agentic"]["request_accounting"]["records_warmup_dropped"] >= 4
    _assert_one_energy(point)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest("-p", "no:cacheprovider", "--inferbench-no-plots",
                                "--inferbench-replay-duration=120", f"--junitxml={junit}",
                                *TP8_CONC4)
    result.assert_outcomes(passed=1)
    assert 'name="agentic_traces" value="synthetic' in junit.read_text(encoding="utf-8")



# The same vLLM server with and without a CPU-DRAM tier (vllm-simple), its KV pool capped at
# 375 pages of 64 tokens: two lanes of ~16k-token sessions do not both fit, so without the tier
# each turn recomputes the prompt the other lane's turn evicted.
OFFLOAD_RECIPE = """\
qwen3.5-fp8-b200-vllm-agentic:
  image: vllm/vllm-openai:v0.22.0
  model: Qwen/Qwen3.5-397B-A17B-FP8
  model-prefix: qwen3.5
  runner: cluster:b200-dgxc
  precision: fp8
  framework: vllm
  multinode: false
  scenarios:
    agentic-coding:
    - dram-utilization: 0.80
      search-space:
      - { tp: 8, kv-offloading: none, conc-list: [2] }
      - { tp: 8, kv-offloading: dram, kv-offload-backend: { name: vllm-simple }, conc-list: [2] }
"""
SMALL_HBM_SPEC = """\
command: [vllm, serve, '{model}']
args: ['--port={port}', '--tensor-parallel-size={tp}', --block-size, '64',
       --num-gpu-blocks-override, '375', --max-num-batched-tokens, '16384',
       --max-model-len, '32768']
port: 8888
health-path: /health
startup-timeout: 120
"""


def _offload_project(pytester: pytest.Pytester) -> Path:
    """The offload recipe (a dram point and its twin without offload) with a small HBM pool,
    and its traces: two sessions of four back-to-back turns, each repeating the last one's
    ~16k tokens."""
    from pytest_inferbench.loadgen.synthetic_traces import (
        SyntheticTraceSettings,
        write_synthetic_traces,
    )

    pytester.path.joinpath("nvidia-master.yaml").write_text(OFFLOAD_RECIPE, encoding="utf-8")
    pytester.path.joinpath("runners.yaml").write_text(
        "hardware:\n  cluster:b200-dgxc: { available-cpu-dram-mib: 3095781, gpus-per-node: 8 }\n",
        encoding="utf-8")
    pytester.mkdir("launch").joinpath("qwen3.5_fp8_b200_vllm.yaml").write_text(
        SMALL_HBM_SPEC, encoding="utf-8")
    return write_synthetic_traces(pytester.path, SyntheticTraceSettings(
        traces=2, turns=4, subagents=0, first_blocks=250, growth_blocks=10, output_tokens=16,
        think_time_s=0.0, seed=1))


def _points(pytester: pytest.Pytester) -> dict[str, Any]:
    points = {}
    for path in (pytester.path / "inferbench-results" / "points").glob("*.json"):
        if not path.name.startswith("agg_"):
            data = json.loads(path.read_text(encoding="utf-8"))
            points[data["inferbench"]["exp_name"]] = data
    return points


def test_a_dram_point_on_sim_server_hits_dram_and_beats_the_same_point_without_offload(
        pytester: pytest.Pytester) -> None:
    traces = _offload_project(pytester)
    # Model time, not as fast as possible: TTFT is only compared where it is the model's.
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--inferbench-backend=sim-server",
        "--inferbench-time-scale=0.5", "--inferbench-replay-duration=2",
        "--inferbench-no-plots", f"--inferbench-traces={traces}")
    # A busy machine may fail a point's client self-check; its files are written all the same.
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == 2, result.stdout.str()
    assert "Traceback" not in result.stdout.str()
    points = _points(pytester)
    plain = points["qwen3.5_tp8_conc2_kvnone"]
    offload = points["qwen3.5_tp8_conc2_kvdram-vllm-simple"]
    tiers = offload["inferbench"]["server_metrics"]["kv_tiers"]
    assert tiers["dram_hit_tokens"] > 0
    assert tiers["offload_bytes_written"] > 0 and tiers["offload_bytes_read"] > 0
    # vLLM's own names for them, in the scrape's counter deltas.
    deltas = offload["inferbench"]["server_metrics"]["counter_deltas"]
    assert deltas["vllm:external_prefix_cache_hits_total"] == tiers["dram_hit_tokens"]
    assert deltas["vllm:kv_offload_bytes_cpu_to_gpu_total"] == tiers["offload_bytes_read"]
    assert "kv_tiers" not in plain["inferbench"]["server_metrics"]  # no tier, none reported
    assert offload["mean_ttft_ms"] < plain["mean_ttft_ms"]


def test_a_dram_point_in_process_hits_dram_and_beats_the_same_point_without_offload(
        pytester: pytest.Pytester) -> None:
    # The same recipe, spec and traces on the default backend: the engine's CPU-DRAM tier
    # under the in-process replay, on the virtual clock (TTFT is the model's at any load).
    traces = _offload_project(pytester)
    result = pytester.runpytest("-p", "no:cacheprovider", "--inferbench-replay-duration=2",
                                "--inferbench-no-plots", f"--inferbench-traces={traces}")
    result.assert_outcomes(passed=2)
    points = _points(pytester)
    plain = points["qwen3.5_tp8_conc2_kvnone"]
    offload = points["qwen3.5_tp8_conc2_kvdram-vllm-simple"]
    tiers = offload["inferbench"]["server_metrics"]["kv_tiers"]
    assert tiers["dram_hit_tokens"] > 0
    assert tiers["offload_bytes_written"] > 0 and tiers["offload_bytes_read"] > 0
    assert "kv_tiers" not in plain["inferbench"]["server_metrics"]
    assert offload["mean_ttft_ms"] < plain["mean_ttft_ms"]


OLDER_SCHEMA = """\
agent-fp4-b200-vllm:
  image: img
  model: Qwen/Qwen3.5-397B-A17B-FP8
  model-prefix: qwen3.5
  runner: b200-trt
  precision: fp8
  framework: vllm
  multinode: false
  scenarios:
    agentic-coding:
      - duration: 900
        search-space:
          - { tp: 8, offloading: cpu, conc-list: [4] }
"""


def test_an_older_schema_offloading_point_skips_on_sim_server_saying_why(
        pytester: pytest.Pytester) -> None:
    pytester.path.joinpath("amd-master.yaml").write_text(OLDER_SCHEMA, encoding="utf-8")
    result = pytester.runpytest_subprocess(*FAST)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*agentic-coding: offloading cpu is not simulated (the "
                                 "simulator's CPU-DRAM tier serves kv-offloading: dram)*"])


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
