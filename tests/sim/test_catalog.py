"""Catalog numbers are computed from the architecture and agree with the published ones.

Expected values are the independent derivations in performance-model.md §A6 (parameter counts
from the AIConfigurator configs, cross-checked with the model cards) and §D.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_inferbench.recipe.model import GPU_BY_RUNNER_PREFIX, hardware_for_runner
from pytest_inferbench.sim import catalog
from pytest_inferbench.sim.physics import EngineConfigError, kv_capacity_tokens, shard_model


def test_minimax_m3_parameters_match_the_model_card_derivation() -> None:
    m3 = catalog.architecture("MiniMax-M3")
    params = m3.part_params()
    # §A6: routed experts 413.1B, shared 3.23B, dense FFN 0.68B, attention 6.42B, embed and
    # lm_head 1.23B each -> 425.9B total, ~24.5B active per token incl. lm_head.
    assert params["experts"] / 1e9 == pytest.approx(413.1, abs=0.05)
    assert params["shared_experts"] / 1e9 == pytest.approx(3.23, abs=0.005)
    assert params["dense_ffn"] / 1e9 == pytest.approx(0.68, abs=0.005)
    assert params["attention"] / 1e9 == pytest.approx(6.42, abs=0.005)
    assert m3.total_params / 1e9 == pytest.approx(425.9, abs=0.1)
    assert m3.active_params / 1e9 == pytest.approx(24.5, abs=0.05)
    # 60 layers x 2 x 4 KV heads x 128 = 60 KiB per token at fp8 over all GPUs.
    assert m3.kv_bytes_per_token(1.0) == 60 * 1024


def test_minimax_m25_parameters_match_the_model_card_derivation() -> None:
    m25 = catalog.architecture("MiniMax-M2.5")
    assert m25.total_params / 1e9 == pytest.approx(228.6, abs=0.1)  # §A6: 228.6B / 10.4B
    assert m25.active_params / 1e9 == pytest.approx(10.4, abs=0.05)
    assert m25.kv_bytes_per_token(1.0) == 124 * 1024  # §A6: KV 124 KiB/token FP8


def test_checkpoint_sizes_follow_from_the_dtypes() -> None:
    # §A6: MXFP4 derived estimate ~245 GB (experts at 4.25 bit + rest bf16); MXFP8 ~444 GB.
    assert catalog.checkpoint("amd/MiniMax-M3-MXFP4").weight_bytes / 1e9 == pytest.approx(
        245, rel=0.01)
    assert catalog.checkpoint("MiniMaxAI/MiniMax-M3-MXFP8").weight_bytes / 1e9 == pytest.approx(
        444, rel=0.01)
    experts = catalog.checkpoint("amd/MiniMax-M3-MXFP4").part_bytes()["experts"]
    assert experts / 1e9 == pytest.approx(219.5, rel=0.001)  # §A6: experts 219.5 GB


def test_per_gpu_sharding_at_tp4_matches_the_fit_inputs() -> None:
    mi355x = catalog.hardware("MI355X")
    m = shard_model(catalog.checkpoint("amd/MiniMax-M3-MXFP4"), mi355x, tp=4, dp_attn=False,
                    kv_dtype="fp8", online_quant="fp8")
    # §D: B_expert (MXFP4) = 56.6M x 0.531 B = 30.1 MB per expert, split over 4 GPUs.
    assert m.expert_bytes * 4 / 1e6 == pytest.approx(30.1, rel=0.005)
    # §D: non-expert FP8 10.32 GB + lm_head bf16 2.46 GB, over 4 GPUs (plus the tiny router).
    assert m.base_bytes * 4 / 1e9 == pytest.approx(10.32 + 2.46 + 0.04, rel=0.005)
    # §A6: with TP4 each GPU holds 1 KV head -> 15 KiB/token/GPU at fp8, plus the indexer keys.
    index_key_bytes = 57 / 4 * 128
    assert m.kv_store_per_token == pytest.approx(15 * 1024 + index_key_bytes)


def test_hardware_without_fp4_keeps_4bit_weights_and_computes_them_in_bf16() -> None:
    # Weight-only W4A16 (Marlin / Triton MXFP4 kernels): same bytes, bf16 GEMM rate.
    ckpt = catalog.checkpoint("amd/MiniMax-M3-MXFP4")
    on_355 = shard_model(ckpt, catalog.hardware("MI355X"), tp=8, dp_attn=False, kv_dtype="fp8",
                         online_quant=None)
    on_300 = shard_model(ckpt, catalog.hardware("MI300X"), tp=8, dp_attn=False, kv_dtype="fp8",
                         online_quant=None)
    assert on_300.expert_bytes == on_355.expert_bytes
    mi300x = catalog.hardware("MI300X")
    experts_s = 2.0 * ckpt.architecture.moe_layers * ckpt.architecture.top_k * (
        ckpt.architecture.expert_params) / (8 * mi300x.peak_flops["bf16"])
    assert on_300.linear_s_per_token > experts_s


def test_weights_that_do_not_fit_are_a_clear_error() -> None:
    h100 = catalog.hardware("H100")
    m = shard_model(catalog.checkpoint("MiniMaxAI/MiniMax-M3-MXFP8"), h100, tp=2, dp_attn=False,
                    kv_dtype="fp8", online_quant=None)
    with pytest.raises(EngineConfigError, match=r"weights do not fit.*H100 80 GB"):
        kv_capacity_tokens(hw=h100, models=[m], gpu_memory_utilization=0.9,
                           max_num_batched_tokens=8192)


@pytest.mark.parametrize(("lookup", "name", "listed"), [
    (catalog.hardware, "TPU-v9", "MI355X"),
    (catalog.checkpoint, "meta-llama/Llama-9", "amd/MiniMax-M3-MXFP4"),
    (catalog.framework, "tgi", "atom, sglang, trt, vllm"),
])
def test_unknown_names_list_the_known_ones(lookup: Callable[[str], object], name: str,
                                          listed: str) -> None:
    with pytest.raises(catalog.CatalogError, match="unknown") as info:
        lookup(name)
    assert name in str(info.value) and listed in str(info.value)


def test_names_resolve_case_insensitively_and_by_basename() -> None:
    assert catalog.hardware("mi355x").name == "MI355X"
    assert catalog.checkpoint("minimax-m3-mxfp4").name == "amd/MiniMax-M3-MXFP4"


def test_every_catalog_entry_loads() -> None:
    for name in catalog.hardware_names():
        hw = catalog.hardware(name)
        assert hw.hbm_bytes > 0 and hw.supports("bf16") and hw.supports("fp8")
    for name in catalog.checkpoint_names():
        assert catalog.checkpoint(name).weight_bytes > 0
    for name in catalog.framework_names():
        assert catalog.framework(name).step_overhead_s > 0




# Served by CPU builds (vLLM's, in the real-engine tier): the simulator models GPUs only and
# refuses these by name at preflight.
NOT_SIMULATED = {"CPU"}


def test_every_runner_the_recipe_model_accepts_has_simulator_hardware() -> None:
    # A runner the recipes accept but the simulator lacks would collect and error at setup.
    known = set(catalog.hardware_names())
    for runner in GPU_BY_RUNNER_PREFIX:
        hardware = hardware_for_runner(runner)
        assert hardware is not None, runner
        assert hardware in known or hardware in NOT_SIMULATED, (runner, hardware, sorted(known))
    assert not NOT_SIMULATED & known


# No NVLink or Infinity Fabric: the GPUs of one server talk over PCIe.
PCIE_ONLY = ("RTX6000PRO",)


def test_interconnects_per_runner() -> None:
    # NVL72 racks are one 72-GPU NVLink domain; every other platform is an 8-GPU node.
    for name in catalog.hardware_names():
        hw = catalog.hardware(name)
        assert hw.scaleup_gpus == (72 if name in ("GB200", "GB300") else 8), name
        if name in PCIE_ONLY:
            # PCIe 5.0 x16 is about a 400 Gb/s NIC's rate: leaving the server costs little more.
            assert hw.nic_bytes_per_s <= hw.link_bytes_per_s < 2 * hw.nic_bytes_per_s, name
            continue
        # The scale-up fabric is faster per GPU than the NIC, which is what makes a worker or
        # a KV-cache transfer that leaves its domain slower.
        assert hw.link_bytes_per_s > 4 * hw.nic_bytes_per_s, name
    # ConnectX-8 (800 Gb/s) on Blackwell Ultra, ConnectX-7 / Pollara (400 Gb/s) before it.
    assert catalog.hardware("GB300").nic_bytes_per_s == 2 * catalog.hardware(
        "GB200").nic_bytes_per_s == 100e9
    assert catalog.hardware("B300").nic_bytes_per_s == 100e9
    assert catalog.hardware("MI355X").nic_bytes_per_s == 50e9
