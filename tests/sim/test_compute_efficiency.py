"""Compute efficiency: attention kernels run at the chip's realizable FLOP fraction, the
profile's fitted figure prices the GEMMs; and the ATOM figure, fitted on the whole calibration
table, prices that table's prefill near what §A8's own fit found."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_inferbench.sim import calibration, catalog
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.efficiency import Efficiency
from pytest_inferbench.sim.engine import Engine
from pytest_inferbench.sim.physics import PrefillTerms, shard_model

DSR1 = ["vllm", "serve", "deepseek-ai/DeepSeek-R1-0528", "-tp", "8"]


def engine(argv: list[str], hardware: str, efficiency: Efficiency | None = None) -> Engine:
    config, _ = engine_config_from_argv(argv, hardware=hardware, env={})
    return Engine(dataclasses.replace(config, efficiency=efficiency))


def test_a_long_context_decode_step_is_not_priced_at_the_gemm_efficiency() -> None:
    """One sequence at 128k context on 8 x H200: its MLA attention is a few hundred GFLOP per
    GPU, a fraction of a millisecond at the chip's attention rate. A calibration that finds the
    GEMMs slow (1% of peak) must not make that attention 50x slower too."""
    ctx = 131072.0
    slow_gemms = Efficiency(step_overhead_s=0.004, hbm_efficiency=0.8, compute_efficiency=0.01)
    fast_gemms = dataclasses.replace(slow_gemms, compute_efficiency=0.5)
    slow = engine(DSR1, "H200", slow_gemms).cost
    fast = engine(DSR1, "H200", fast_gemms).cost
    assert slow.attn_eta_flops == fast.attn_eta_flops == catalog.hardware("H200").achievable_flops
    m = slow.target
    attention_at_gemm_rate = m.attn_a_s * ctx / slow_gemms.compute_efficiency
    step_slow = float(slow.step(decode_seqs=1.0, decode_ctx=ctx, decode_ctx_win=ctx))
    step_fast = float(fast.step(decode_seqs=1.0, decode_ctx=ctx, decode_ctx_win=ctx))
    # The slow GEMMs cost one token's worth of FLOPs more; attention is not among them.
    assert step_slow < attention_at_gemm_rate
    assert step_slow - step_fast < 0.25 * attention_at_gemm_rate


def test_atoms_compute_efficiency_prices_the_calibration_prefill_near_a8s_fit() -> None:
    """§A8's fit: a mean prompt of the calibration sweep (7373 tokens, uniform in
    [0.8 x 8192, 8192]) prefills at 23 us/token on the TP4 group. The profile's figure is fitted
    on the sweep's TTFT, TPOT and throughput together (tests/sim/test_calibration.py); it must
    still price that prefill within the sweep's own spread of that fit (the conc 4 TTFT §A8's
    t_pf leaves 11% short), not anywhere the fit might wander."""
    config, _ = engine_config_from_argv(list(calibration.ARGV), hardware=calibration.HARDWARE,
                                        env=dict(calibration.ENV))
    cost = Engine(config).cost
    chunk = PrefillTerms(cost.target.window)
    chunk.add(0.0, 7373, True)
    per_token = cost.step_with(0.0, 0.0, 0.0, chunk) / 7373
    assert per_token == pytest.approx(23e-6, rel=0.15)


def test_routed_experts_prefill_alike_in_bf16_and_fp8_but_stream_their_own_bytes() -> None:
    """The same architecture as a bf16 and an fp8 checkpoint on 8 x H100: the fp8 experts are
    half the bytes to stream in decode, but their grouped GEMMs multiply at the same (bf16)
    rate; the dense GEMMs (attention projections) keep the fp8 tensor rate."""
    hw = catalog.hardware("H100")
    bf16, fp8 = (shard_model(catalog.checkpoint(name), hw, tp=8, dp_attn=False, kv_dtype="auto",
                             online_quant=None)
                 for name in ("Qwen/Qwen3-235B-A22B-Instruct-2507",
                              "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"))
    assert fp8.expert_bytes == pytest.approx(bf16.expert_bytes / 2, rel=0.01)
    assert fp8.expert_s_per_token == pytest.approx(bf16.expert_s_per_token)
    dense = (bf16.linear_s_per_token - bf16.expert_s_per_token,
             fp8.linear_s_per_token - fp8.expert_s_per_token)
    assert dense[1] == pytest.approx(dense[0] / 2, rel=0.01)
