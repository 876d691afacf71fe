"""Calibration: ATOM MiniMax-M3 MXFP4 on 4 x MI355X, TP4, ISL 8192 / OSL 1024, no speculation.

The measured table is ROCm/ATOM recipes/MiniMax-M3.md, as quoted in
../shared/reference/performance-model.md §A8 (benchmark_serving, random dataset, range ratio
0.8, 10 x CONC prompts, request rate inf). The server argv is the recipe's own command.
Acceptance (issue 3): mean TPOT within 10%, mean TTFT within 25%, output throughput within 10%.
"""

from __future__ import annotations

import pytest

from pytest_inferbench.metrics import summarize
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.driver import simulate_point
from pytest_inferbench.workload import LoadSettings, build_workload

ATOM_RECIPE_ARGV = [
    "python", "-m", "atom.entrypoints.openai_server", "--model", "amd/MiniMax-M3-MXFP4",
    "--tensor-parallel-size", "4", "--kv_cache_dtype", "fp8", "--block-size", "128",
    "--max-model-len", "32768", "--max-num-seqs", "128", "--max-num-batched-tokens", "32768",
    "--online_quant_config",
    '{"global_quant_config": "ptpc_fp8", "exclude": ["lm_head", "*embed*", "*vision*", '
    '"*block_sparse_moe*"]}',
    "--no-enable_prefix_caching", "--hf-overrides", '{"use_index_cache":true,"index_topk_freq":4}',
]
# CONC: (TTFT mean ms, TPOT mean ms, output tok/s), performance-model.md §A8.
MEASURED = {
    4: (260.8, 7.50, 502),
    8: (295.5, 8.78, 865),
    16: (383.0, 11.73, 1280),
    32: (512.3, 16.74, 1807),
    64: (832.0, 25.00, 2433),
}


@pytest.mark.parametrize("conc", sorted(MEASURED))
def test_atom_minimax_m3_mxfp4_tp4_mi355x_8k1k(conc: int) -> None:
    config, _ = engine_config_from_argv(ATOM_RECIPE_ARGV, hardware="MI355X",
                                        env={"AITER_QUICK_REDUCE_QUANTIZATION": "INT4"})
    assert config.online_quant == "fp8"
    point = simulate_point(config, build_workload(8192, 1024, conc, LoadSettings()))
    s = summarize(point.records, duration_s=point.duration_s, num_prompts=10 * conc,
                  max_concurrency=conc, num_gpus=4)
    ttft, tpot, throughput = MEASURED[conc]
    got = (s["mean_ttft_ms"], s["mean_tpot_ms"], s["output_throughput"])
    report = f"conc {conc}: predicted TTFT/TPOT/tput {got}, measured {MEASURED[conc]}"
    assert s["completed"] == 10 * conc, report
    assert s["mean_tpot_ms"] == pytest.approx(tpot, rel=0.10), report
    assert s["mean_ttft_ms"] == pytest.approx(ttft, rel=0.25), report
    assert s["output_throughput"] == pytest.approx(throughput, rel=0.10), report
