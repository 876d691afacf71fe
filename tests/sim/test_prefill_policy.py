"""Prefill-heavy load: how each framework's scheduler interleaves prefill chunks with decode by
default (docs/simulator.md, "Scheduler": the defaults the engines pick by GPU memory, a chunk's
blocks whole or not at all, SGLang's DP attention)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pytest_inferbench.loadgen.workload import LoadSettings, build_workload
from pytest_inferbench.sim import catalog
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.config import EngineConfig
from pytest_inferbench.sim.driver import simulate_point
from pytest_inferbench.sim.engine import Engine

QWEN3 = "Qwen/Qwen3-235B-A22B-Instruct-2507"


@pytest.mark.parametrize(("argv", "hardware", "budget", "seqs"), [
    # vLLM's OpenAI server on a GPU of 70 GiB or more (EngineArgs.get_batch_defaults)
    (["vllm", "serve", QWEN3, "-tp", "8"], "H100", 8192, 1024),
    (["vllm", "serve", QWEN3, "-tp", "8"], "B200", 8192, 1024),
    # SGLang's --chunked-prefill-size by GPU memory: 8192 under 160 GiB, 16384 above
    (["python3", "-m", "sglang.launch_server", "--model", QWEN3, "--tp", "8"], "H200", 8192, 256),
    (["python3", "-m", "sglang.launch_server", "--model", QWEN3, "--tp", "8"], "B200", 16384,
     256),
    (["python3", "-m", "sglang.launch_server", "--model", QWEN3, "--tp", "8"], "MI300X", 16384,
     256),
    # what the argv says wins over the tier
    (["python3", "-m", "sglang.launch_server", "--model", QWEN3, "--tp", "8",
      "--chunked-prefill-size", "4096"], "B200", 4096, 256),
    (["vllm", "serve", QWEN3, "-tp", "8", "--max-num-seqs", "64"], "H100", 8192, 64),
])
def test_default_token_budget_and_batch_follow_the_gpus_memory(
        argv: list[str], hardware: str, budget: int, seqs: int) -> None:
    config, _ = engine_config_from_argv(argv, hardware=hardware)
    assert (config.max_num_batched_tokens, config.max_num_seqs) == (budget, seqs)


def test_a_memory_tier_naming_an_unknown_argument_is_refused() -> None:
    with pytest.raises(catalog.CatalogError, match="not among `defaults`"):
        catalog._memory_defaults("x", [{"min_gib": 70, "max_num_seq": 1}], {"max_num_seqs"})



def test_a_prefill_chunk_that_does_not_fit_waits_instead_of_being_cut_and_preempted() -> None:
    # vLLM V1 allocates a chunk's blocks whole or not at all: with room for about two of
    # these 8000-token prompts, the next one waits, holding its first chunk, while the others
    # decode; nothing is computed twice. (Cut to the free blocks, each sliver was preempted by
    # the next decoder's block and recomputed: 37 preemptions here.)
    config = EngineConfig(hardware="MI355X", model="amd/MiniMax-M3-MXFP4", framework="atom",
                          tp=4, max_num_seqs=64, max_num_batched_tokens=2048, block_size=16,
                          gpu_memory_utilization=0.8, kv_cache_dtype="fp8")
    # The cache grows linearly with the utilization: solve for room for 17000 tokens.
    cap = Engine(config).kv_capacity_tokens
    per_unit = (cap - Engine(replace(config, gpu_memory_utilization=0.75)
                             ).kv_capacity_tokens) / 0.05
    config = replace(config, gpu_memory_utilization=0.8 - (cap - 17_000) / per_unit)
    workload = build_workload(8000, 50, 6, LoadSettings(prompts_per_conc=4, warmup_per_conc=1))
    prompts = sum(r.input_tokens for r in workload.requests)
    for plan in (True, False):  # the planned closed loop and the engine step by step
        metrics = simulate_point(config, workload, plan=plan).server_metrics
        assert metrics["preemptions"] == 0
        assert metrics["max_kv_cache_usage"] > 0.9  # the cache did run short
        assert metrics["prompt_tokens"] == prompts


@pytest.mark.parametrize(("dp", "dp_attn"), [([], False), (["--dp-size", "8"], True)])
def test_sglang_turns_dp_attention_off_without_a_dp_size(dp: list[str], dp_attn: bool) -> None:
    # SGLang's server_args: DP attention with --dp-size 1 (the default) is switched off.
    config, ignored = engine_config_from_argv(
        ["python3", "-m", "sglang.launch_server", "--model", QWEN3, "--tp", "8",
         "--enable-dp-attention", *dp], hardware="H200")
    assert (config.tp, config.dp_attn) == (8, dp_attn)
    assert any("--enable-dp-attention" in flag for flag in ignored) is not dp_attn


def test_atom_dp_attention_needs_no_dp_size() -> None:
    config, _ = engine_config_from_argv(
        ["python3", "-m", "atom.entrypoints.openai_server", "--model", QWEN3, "-tp", "8",
         "--enable-dp-attention"], hardware="MI355X")
    assert config.dp_attn
