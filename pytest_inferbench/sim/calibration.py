"""The measurements the simulator is calibrated on: ATOM serving MiniMax-M3 MXFP4 on 4 x MI355X
(TP4, ISL 8192 / OSL 1024, no speculation).

Source: ROCm/ATOM `recipes/MiniMax-M3.md`, as quoted in performance-model.md §A8
(benchmark_serving, random dataset, range ratio 0.8, 10 x CONC prompts, request rate inf). The
server argv is that recipe's own command. The calibration test and the reference table
(`benchmarks/sim_reference.py`) both read them here.
"""

from __future__ import annotations

HARDWARE = "MI355X"
FRAMEWORK = "atom"  # a registry name (frameworks/entries/)
MODEL = "amd/MiniMax-M3-MXFP4"
ISL, OSL = 8192, 1024
NUM_GPUS = 4
ARGV = (
    "python", "-m", "atom.entrypoints.openai_server", "--model", MODEL,
    "--tensor-parallel-size", "4", "--kv_cache_dtype", "fp8", "--block-size", "128",
    "--max-model-len", "32768", "--max-num-seqs", "128", "--max-num-batched-tokens", "32768",
    "--online_quant_config",
    '{"global_quant_config": "ptpc_fp8", "exclude": ["lm_head", "*embed*", "*vision*", '
    '"*block_sparse_moe*"]}',
    "--no-enable_prefix_caching", "--hf-overrides", '{"use_index_cache":true,"index_topk_freq":4}',
)
ENV = {"AITER_QUICK_REDUCE_QUANTIZATION": "INT4"}
# concurrency: (mean TTFT ms, mean TPOT ms, output tok/s)
MEASURED: dict[int, tuple[float, float, float]] = {
    4: (260.8, 7.50, 502),
    8: (295.5, 8.78, 865),
    16: (383.0, 11.73, 1280),
    32: (512.3, 16.74, 1807),
    64: (832.0, 25.00, 2433),
}
