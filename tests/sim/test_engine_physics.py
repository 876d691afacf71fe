"""Physics sanity: the simulator's predictions move the way the hardware says they must."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from pytest_inferbench.loadgen.workload import LoadSettings, build_workload
from pytest_inferbench.recipe.golden import packaged
from pytest_inferbench.results.metrics import summarize
from pytest_inferbench.sim import catalog
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.config import EngineConfig
from pytest_inferbench.sim.driver import simulate_point
from pytest_inferbench.sim.engine import Engine
from pytest_inferbench.sim.physics import shard_model, windowed_sum

EAGLE3 = ["--method", "eagle3", "--draft-model", "Inferact/MiniMax-M3-EAGLE3",
          "--num-speculative-tokens", "3"]
# No chat-template kwargs turn thinking off, so the engine aims at the thinking_on golden AL.
GOLDEN_AL = packaged().lookup("MiniMax-M3", "eagle3", "thinking_on", 3)


def atom_argv(model: str = "amd/MiniMax-M3-MXFP4", tp: int = 4) -> list[str]:
    """The shipped ATOM launch spec's server argv (benchmarks/launch/*_mi355x_atom.yaml)."""
    return ["python3", "-m", "atom.entrypoints.openai_server", "--model", model,
            "--server-port", "8888", "-tp", str(tp), "--block-size", "128",
            "--gpu-memory-utilization", "0.8", "--max-model-len", "32768",
            "--max-num-batched-tokens", "32768", "--max-num-seqs", "256",
            "--kv_cache_dtype", "fp8", "--trust-remote-code", "--no-enable_prefix_caching"]


def config(argv: list[str], hardware: str = "MI355X") -> EngineConfig:
    return engine_config_from_argv(argv, hardware=hardware)[0]


def predict(cfg: EngineConfig, isl: int, osl: int, conc: int, per_conc: int = 4
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    load = LoadSettings(prompts_per_conc=per_conc, warmup_per_conc=1)
    point = simulate_point(cfg, build_workload(isl, osl, conc, load))
    s = summarize(point.records, duration_s=point.duration_s, num_prompts=per_conc * conc,
                  max_concurrency=conc, num_gpus=cfg.tp)
    assert s["completed"] == per_conc * conc
    return s, point.server_metrics


def test_tpot_grows_with_concurrency() -> None:
    cfg = config(atom_argv())
    tpots = [predict(cfg, 8192, 1024, c)[0]["mean_tpot_ms"] for c in (1, 4, 16, 64)]
    assert tpots == sorted(tpots) and len(set(tpots)) == 4, tpots


def test_more_tensor_parallelism_lowers_small_batch_tpot() -> None:
    tpots = [predict(config(atom_argv(tp=tp)), 1024, 1024, 1)[0]["mean_tpot_ms"]
             for tp in (2, 4, 8)]
    assert tpots[0] > tpots[1] > tpots[2], tpots


def test_eagle3_helps_at_low_concurrency_and_less_as_it_grows() -> None:
    plain, spec = config(atom_argv()), config(atom_argv() + EAGLE3)
    speedups = []
    for conc in (1, 16, 128):
        p, _ = predict(plain, 1024, 1024, conc, per_conc=2)
        s, metrics = predict(spec, 1024, 1024, conc, per_conc=2)
        assert metrics["acceptance_length"] == pytest.approx(GOLDEN_AL, rel=0.02)
        speedups.append(p["mean_tpot_ms"] / s["mean_tpot_ms"])
    assert speedups[0] > 1.5, speedups  # AL ~2.9 tokens per step for a slightly dearer step
    assert speedups[0] > speedups[1] > speedups[2], speedups


def test_mi300x_without_fp4_is_slower_than_mi355x_on_the_fp4_recipe() -> None:
    argv = atom_argv()
    for conc in (1, 32):
        on_355, _ = predict(config(argv, "MI355X"), 1024, 1024, conc)
        on_300, _ = predict(config(argv, "MI300X"), 1024, 1024, conc)
        assert on_300["mean_tpot_ms"] > on_355["mean_tpot_ms"]
        assert on_300["mean_ttft_ms"] > on_355["mean_ttft_ms"]
        assert on_300["output_throughput"] < on_355["output_throughput"]


def test_8k_input_at_tp2_and_conc_256_runs_into_the_kv_cache() -> None:
    tp2 = config(atom_argv("MiniMaxAI/MiniMax-M3-MXFP8", tp=2))
    tp4 = config(atom_argv("MiniMaxAI/MiniMax-M3-MXFP8", tp=4))
    s2, m2 = predict(tp2, 8192, 1024, 256, per_conc=1)
    s4, m4 = predict(tp4, 8192, 1024, 256, per_conc=1)
    demand = 256 * (8192 + 1024)
    assert m2["kv_cache_capacity_tokens"] < demand <= m4["kv_cache_capacity_tokens"]
    assert m2["preemptions"] > 0 and m2["max_kv_cache_usage"] > 0.95
    assert m2["max_num_requests_waiting"] > 0
    assert m4["preemptions"] == 0
    assert s2["mean_ttft_ms"] > 2 * s4["mean_ttft_ms"]


@pytest.mark.parametrize("forced", [None, "2.2", "3.6"])
def test_acceptance_length_from_counters_matches_the_configured_one(forced: str | None) -> None:
    argv = atom_argv() + EAGLE3
    if forced:
        argv += ["--spec-decode-acceptance-length", forced]
    cfg = config(argv)
    _, metrics = predict(cfg, 1024, 1024, 8)
    expected = float(forced) if forced else GOLDEN_AL
    assert metrics["acceptance_length"] == pytest.approx(expected, rel=0.02)
    assert metrics["spec_num_draft_tokens"] == 3 * metrics["spec_num_drafts"]


def test_explicit_distribution_gives_its_mean() -> None:
    # ATOM's measured distribution {0: .144, 1: .120, 2: .1273, 3: .6087} -> AL 3.20 (§A7).
    cfg = config(atom_argv() + EAGLE3 + ["--sim-accepted-distribution",
                                         "[0.144, 0.120, 0.1273, 0.6087]"])
    _, metrics = predict(replace(cfg, seed=3), 1024, 1024, 8)
    assert metrics["acceptance_length"] == pytest.approx(3.20, rel=0.02)
    hist = metrics["spec_accepted_histogram"]
    assert hist[3] / sum(hist) == pytest.approx(0.6087, abs=0.03)


@pytest.mark.parametrize(("batch", "roofline_ms"), [(1, 0.88), (4, 1.74), (16, 4.47), (64, 9.08)])
def test_weight_streaming_matches_the_reference_roofline(batch: int, roofline_ms: float) -> None:
    # performance-model.md §A8: HBM roofline per decode step of MiniMax-M3 MXFP4 (FP8 rest,
    # bf16 lm_head) on one of 4 x MI355X, at 5.6 TB/s (eta 0.7 of 8 TB/s).
    m = shard_model(catalog.checkpoint("amd/MiniMax-M3-MXFP4"), catalog.hardware("MI355X"),
                    tp=4, dp_attn=False, kv_dtype="fp8", online_quant="fp8")
    assert float(m.weight_bytes_read(batch)) / 5.6e12 * 1e3 == pytest.approx(roofline_ms, rel=0.02)


def test_windowed_sums_equal_the_brute_force_sums() -> None:
    for c0, c1, window in [(0, 10, 4), (3, 9, 20), (5, 40, 5), (7, 8, 3), (0, 100, math.inf)]:
        cs = range(c0 + 1, c1 + 1)
        assert windowed_sum(c0, c1, window) == (sum(cs), sum(min(c, window) for c in cs))


def test_kernels_run_one_after_another_so_none_hides_under_another() -> None:
    # A verify batch of 256 tokens: the dense GEMMs are compute-bound, the routed experts
    # (8 tokens per expert) stream their weights. Kernels run in sequence, so the forward
    # takes at least the dense GEMMs' compute plus the experts' weight streaming, more than
    # the longer of the step's total bytes and total FLOPs.
    cfg = config(atom_argv())
    cost = Engine(cfg).cost
    m = cost.target
    n = 256.0
    dense_compute = n * (m.linear_s_per_token - m.expert_s_per_token) / cost.eta_flops
    expert_stream = (float(m.weight_bytes_read(n)) - m.base_bytes) / cost.mem_bytes_per_s
    total_bytes = float(m.weight_bytes_read(n)) / cost.mem_bytes_per_s
    total_flops = n * (m.linear_s_per_token + m.lm_head_s_per_token) / cost.eta_flops
    t = float(cost.forward(m, n, n, 0.0, 0.0, 0.0, 0.0))
    assert t >= dense_compute + expert_stream > max(total_bytes, total_flops)
