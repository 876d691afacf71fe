"""Physics sanity per model family: the simulator moves the way hardware and models must.

No expected numbers: every assertion compares the simulator with itself across one knob
(concurrency, TP, weight dtype, speculative decoding, GPU generation, KV capacity).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pytest_inferbench.loadgen.workload import LoadSettings, build_workload
from pytest_inferbench.results.metrics import summarize
from pytest_inferbench.sim import catalog
from pytest_inferbench.sim.config import EngineConfig, SpecConfig
from pytest_inferbench.sim.driver import simulate_point
from pytest_inferbench.sim.engine import Engine

# One checkpoint per family, each served as an InferenceX node of that family serves it.
FAMILIES = {
    "DeepSeek-R1": EngineConfig(hardware="B200", model="deepseek-ai/DeepSeek-R1-0528",
                                framework="sglang", tp=8, kv_cache_dtype="fp8"),
    "DeepSeek-V4-Pro": EngineConfig(hardware="B200", model="deepseek-ai/DeepSeek-V4-Pro",
                                    framework="vllm", tp=8, kv_cache_dtype="fp8"),
    "GLM-5": EngineConfig(hardware="B200", model="zai-org/GLM-5-FP8", framework="sglang",
                          tp=8, kv_cache_dtype="fp8"),
    "gpt-oss-120b": EngineConfig(hardware="H200", model="openai/gpt-oss-120b",
                                 framework="vllm", tp=2),
    "Kimi-K2.5": EngineConfig(hardware="B200", model="moonshotai/Kimi-K2.5", framework="vllm",
                              tp=8),
    "MiniMax-M3": EngineConfig(hardware="MI355X", model="amd/MiniMax-M3-MXFP4",
                               framework="atom", tp=4, kv_cache_dtype="fp8", block_size=128),
    "Qwen3.5-397B-A17B": EngineConfig(hardware="B200", model="Qwen/Qwen3.5-397B-A17B-FP8",
                                      framework="sglang", tp=4, kv_cache_dtype="fp8"),
}


def measure(config: EngineConfig, conc: int, *, isl: int = 1024, osl: int = 64,
            prompts_per_conc: int = 1) -> dict[str, float]:
    load = LoadSettings(prompts_per_conc=prompts_per_conc, warmup_per_conc=1)
    workload = build_workload(isl, osl, conc, load)
    point = simulate_point(config, workload, engine=Engine(config, keep_traces=True))
    s = summarize(point.records, duration_s=point.duration_s, num_prompts=prompts_per_conc * conc,
                  max_concurrency=conc, num_gpus=config.tp)
    return {"tpot": s["mean_tpot_ms"], "throughput": s["output_throughput"],
            "preemptions": float(point.server_metrics["preemptions"])}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tpot_rises_with_concurrency(family: str) -> None:
    config = FAMILIES[family]
    tpots = [measure(config, conc)["tpot"] for conc in (1, 8, 32)]
    assert tpots[0] < tpots[1] < tpots[2], tpots


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tpot_falls_with_tensor_parallelism(family: str) -> None:
    config = FAMILIES[family]
    # On a 288 GB chip of the same vendor, so the half-TP node still holds the weights.
    big = "MI355X" if config.hardware.startswith("MI") else "B300"
    more = replace(config, hardware=big, tp=min(config.tp * 2, 8))
    fewer = replace(more, tp=more.tp // 2)
    assert measure(more, 4)["tpot"] < measure(fewer, 4)["tpot"]


@pytest.mark.parametrize(("hardware", "models"), [
    # Same architecture, lighter weights: NVFP4 < FP8 < BF16 bytes per decode step. At conc 8
    # the routed experts dominate the bytes; at conc 1 the FP4 checkpoints' bf16 attention
    # (kept unquantized) can outweigh the few experts touched, and the FP8 one is faster.
    ("B200", ("nvidia/Qwen3.5-397B-A17B-NVFP4", "Qwen/Qwen3.5-397B-A17B-FP8",
              "Qwen/Qwen3.5-397B-A17B")),
    ("B200", ("nvidia/DeepSeek-R1-0528-FP4-V2", "deepseek-ai/DeepSeek-R1-0528")),
    ("B200", ("nvidia/GLM-5-NVFP4", "zai-org/GLM-5-FP8")),
    ("MI355X", ("amd/MiniMax-M3-MXFP4", "MiniMaxAI/MiniMax-M3-MXFP8")),
    ("MI355X", ("amd/Qwen3.5-397B-A17B-MXFP4", "Qwen/Qwen3.5-397B-A17B-FP8",
                "Qwen/Qwen3.5-397B-A17B")),
])
def test_fewer_weight_bits_decode_faster_at_low_batch(hardware: str,
                                                      models: tuple[str, ...]) -> None:
    tpots = [measure(EngineConfig(hardware=hardware, model=m, framework="sglang", tp=8,
                                  kv_cache_dtype="fp8"), 8)["tpot"] for m in models]
    assert tpots == sorted(tpots) and len(set(tpots)) == len(tpots), tpots


@pytest.mark.parametrize(("config", "method", "draft"), [
    (FAMILIES["DeepSeek-R1"], "mtp", None),
    (FAMILIES["DeepSeek-V4-Pro"], "mtp", None),
    (FAMILIES["GLM-5"], "mtp", None),
    (FAMILIES["Qwen3.5-397B-A17B"], "mtp", None),
    (FAMILIES["MiniMax-M3"], "eagle3", "Inferact/MiniMax-M3-EAGLE3"),
], ids=["dsr1-mtp", "dsv4-mtp", "glm5-mtp", "qwen3.5-mtp", "minimaxm3-eagle3"])
def test_speculative_decoding_helps_at_low_concurrency(config: EngineConfig, method: str,
                                                       draft: str | None) -> None:
    spec = replace(config, spec=SpecConfig(method=method, draft_model=draft,
                                           num_speculative_tokens=3))
    assert measure(spec, 2)["tpot"] < measure(config, 2)["tpot"]


@pytest.mark.parametrize(("model", "chips"), [
    # An FP4 checkpoint with FP4 dense GEMMs (its shared experts): B300's FP4 peak beats
    # B200's once prefill is compute-bound. (Routed experts multiply at the bf16 rate, so a
    # checkpoint whose only FP4 weights are routed experts runs alike on both.)
    ("nvidia/DeepSeek-R1-0528-FP4-V2", ("B300", "B200")),
    ("deepseek-ai/DeepSeek-R1-0528", ("B200", "H200")),
    ("openai/gpt-oss-120b", ("B200", "H200", "H100")),
    ("Qwen/Qwen3.5-397B-A17B-FP8", ("MI355X", "MI325X", "MI300X")),
    ("moonshotai/Kimi-K2.5", ("MI355X", "MI325X", "MI300X")),
    ("zai-org/GLM-5-FP8", ("MI355X", "MI325X")),
])
def test_newer_gpus_serve_the_same_config_faster(model: str, chips: tuple[str, ...]) -> None:
    throughput = [measure(EngineConfig(hardware=chip, model=model, framework="vllm", tp=8,
                                       kv_cache_dtype="fp8"), 16, isl=8192, osl=64)["throughput"]
                  for chip in chips]
    assert throughput == sorted(throughput, reverse=True) and len(set(throughput)) == len(
        throughput), dict(zip(chips, throughput, strict=False))


def test_kv_capacity_limits_cause_preemption_only_when_the_cache_is_full() -> None:
    # gpt-oss-120b on one H100: 65 GB of weights leave ~7 GB of KV cache, ~190k tokens of bf16
    # KV for the 18 full-attention layers; 64 x 9k-token sequences need three times that.
    config = EngineConfig(hardware="H100", model="openai/gpt-oss-120b", framework="vllm", tp=1,
                          gpu_memory_utilization=0.9)
    engine = Engine(config)
    assert engine.kv_capacity_tokens < 64 * (8192 + 1024)
    assert measure(config, 4, isl=8192, osl=256)["preemptions"] == 0
    assert measure(config, 64, isl=8192, osl=256)["preemptions"] > 0


def test_mla_kv_is_replicated_over_tensor_parallel_ranks_and_split_by_dp_attention() -> None:
    ckpt = catalog.checkpoint("deepseek-ai/DeepSeek-R1-0528")
    from pytest_inferbench.sim.physics import shard_model

    hw = catalog.hardware("B200")
    tp8 = shard_model(ckpt, hw, tp=8, dp_attn=False, kv_dtype="fp8", online_quant=None)
    dpa = shard_model(ckpt, hw, tp=8, dp_attn=True, kv_dtype="fp8", online_quant=None)
    # 61 layers x (512 latent + 64 rope) bytes at fp8, on every rank; DP attention: 1/8 each.
    assert tp8.kv_store_per_token == 61 * 576
    assert dpa.kv_store_per_token == pytest.approx(61 * 576 / 8)


def test_linear_attention_state_does_not_grow_with_context() -> None:
    from pytest_inferbench.sim.physics import shard_model

    qwen = shard_model(catalog.checkpoint("Qwen/Qwen3.5-397B-A17B-FP8"), catalog.hardware("B200"),
                       tp=4, dp_attn=False, kv_dtype="fp8", online_quant=None)
    # Only the 15 full-attention layers keep per-token KV (1 KV head of 256 per rank at TP4);
    # the 45 Gated DeltaNet layers keep a fixed state per sequence.
    assert qwen.kv_store_per_token == 15 * 2 * 1 * 256
    assert qwen.kv_store_per_seq > 0 and qwen.kv_seq == 2 * qwen.kv_store_per_seq
