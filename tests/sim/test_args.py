"""The real servers' argv (ATOM, vLLM, SGLang) configures the simulated engine."""

from __future__ import annotations

import json

import pytest

from pytest_inferbench.sim.args import ArgvError, engine_config_from_argv
from pytest_inferbench.sim.catalog import CatalogError
from pytest_inferbench.sim.engine import Engine

# The ATOM command of the InferenceX MiniMax-M3 recipe (issue 2, item 5) plus the mtp overlay.
ATOM_ARGV = [
    "python3", "-m", "atom.entrypoints.openai_server", "--model", "amd/MiniMax-M3-MXFP4",
    "--server-port", "8888", "-tp", "4", "--block-size", "128", "--gpu-memory-utilization",
    "0.8", "--max-model-len", "32768", "--max-num-batched-tokens", "32768", "--max-num-seqs",
    "256", "--kv_cache_dtype", "fp8", "--trust-remote-code", "--no-enable_prefix_caching",
]
EAGLE3 = ["--method", "eagle3", "--draft-model", "Inferact/MiniMax-M3-EAGLE3",
          "--num-speculative-tokens", "3"]


def test_atom_argv() -> None:
    config, ignored = engine_config_from_argv(ATOM_ARGV, hardware="MI355X")
    assert (config.framework, config.model, config.hardware) == (
        "atom", "amd/MiniMax-M3-MXFP4", "MI355X")
    assert (config.tp, config.ep, config.dp_attn) == (4, 1, False)
    assert (config.block_size, config.max_num_seqs, config.max_num_batched_tokens) == (
        128, 256, 32768)
    assert (config.gpu_memory_utilization, config.kv_cache_dtype, config.max_model_len) == (
        0.8, "fp8", 32768)
    assert config.spec is None
    assert ignored == ["--trust-remote-code"]
    assert config.prefix_caching is False  # --no-enable_prefix_caching


def test_atom_eagle3_and_forced_acceptance() -> None:
    config, _ = engine_config_from_argv(
        [*ATOM_ARGV, *EAGLE3, "--spec-decode-acceptance-length", "2.5"], hardware="mi355x")
    assert config.spec is not None
    assert (config.spec.method, config.spec.draft_model, config.spec.num_speculative_tokens) == (
        "eagle3", "Inferact/MiniMax-M3-EAGLE3", 3)
    assert config.spec.acceptance_length == 2.5
    rate, _ = engine_config_from_argv([*ATOM_ARGV, *EAGLE3, "--spec-decode-acceptance-rate=0.5"],
                                      hardware="MI355X")
    assert rate.spec is not None and rate.spec.acceptance_rate == 0.5
    # AL = 1 + rate * k: the engine's mean tokens per verify step.
    assert Engine(rate).accepted_distribution == pytest.approx((0.0, 0.5, 0.5, 0.0))


def test_both_spellings_and_equals_form_are_the_same_flag() -> None:
    dashes, _ = engine_config_from_argv(
        ["vllm", "serve", "amd/MiniMax-M3-MXFP4", "--kv-cache-dtype", "fp8",
         "--max-num-seqs=64", "--gpu-memory-utilization", "0.85"], hardware="MI355X")
    unders, _ = engine_config_from_argv(
        ["vllm", "serve", "amd/MiniMax-M3-MXFP4", "--kv_cache_dtype=fp8",
         "--max_num_seqs", "64", "--gpu_memory_utilization=0.85"], hardware="MI355X")
    assert dashes == unders
    assert dashes.max_num_seqs == 64 and dashes.kv_cache_dtype == "fp8"


def test_vllm_serve_with_speculative_config_json() -> None:
    spec = {"method": "eagle3", "model": "Inferact/MiniMax-M3-EAGLE3",
            "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_length": 2.78}
    config, ignored = engine_config_from_argv(
        ["vllm", "serve", "MiniMaxAI/MiniMax-M3-MXFP8", "--port", "8000",
         "--tensor-parallel-size", "8", "--enable-expert-parallel",
         "--speculative-config", json.dumps(spec), "--no-enable-prefix-caching"],
        hardware="H200")
    assert (config.framework, config.tp, config.ep) == ("vllm", 8, 8)
    assert config.spec is not None and config.spec.acceptance_length == 2.78
    assert ignored == []
    assert config.prefix_caching is False


def test_vllm_synthetic_acceptance_rates_become_a_distribution() -> None:
    spec = {"method": "eagle3", "model": "Inferact/MiniMax-M3-EAGLE3",
            "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": [0.9, 0.6, 0.3]}
    config, _ = engine_config_from_argv(
        ["vllm", "serve", "amd/MiniMax-M3-MXFP4", "-tp", "4", "--speculative-config",
         json.dumps(spec)], hardware="MI355X")
    assert config.spec is not None
    # P(accepted >= i) = rate_i -> P(0) = 0.1, P(1) = 0.3, P(2) = 0.3, P(3) = 0.3.
    assert config.spec.accepted_distribution == pytest.approx((0.1, 0.3, 0.3, 0.3))


def test_sglang_flags_and_simulated_acceptance_env() -> None:
    config, ignored = engine_config_from_argv(
        ["python", "-m", "sglang.launch_server", "--model-path", "amd/MiniMax-M3-MXFP4",
         "--tp", "4", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
         "--speculative-draft-model-path", "Inferact/MiniMax-M3-EAGLE3",
         "--speculative-eagle-topk", "1", "--mem-fraction-static", "0.8",
         "--max-running-requests", "128", "--enable-dp-attention", "--dp-size", "4"],
        hardware="MI355X", env={"SGLANG_SIMULATE_ACC_LEN": "3.1"})
    assert (config.framework, config.tp, config.dp_attn) == ("sglang", 4, True)
    assert (config.gpu_memory_utilization, config.max_num_seqs) == (0.8, 128)
    assert config.spec is not None
    assert (config.spec.method, config.spec.num_speculative_tokens) == ("eagle3", 3)
    assert config.spec.acceptance_length == 3.1
    assert ignored == ["--speculative-eagle-topk 1"]


def test_explicit_accepted_count_distribution() -> None:
    # ATOM's measured gsm8k distribution (performance-model.md §A7).
    config, _ = engine_config_from_argv(
        [*ATOM_ARGV, *EAGLE3, "--sim-accepted-distribution",
         '{"0": 0.144, "1": 0.120, "2": 0.1273, "3": 0.6087}'], hardware="MI355X")
    assert config.spec is not None
    assert config.spec.accepted_distribution == pytest.approx((0.144, 0.120, 0.1273, 0.6087))


def test_defaults_come_from_the_framework_profile() -> None:
    config, _ = engine_config_from_argv(["vllm", "serve", "amd/MiniMax-M3-MXFP4"],
                                        hardware="MI355X")
    # vLLM's OpenAI server on a GPU of 70 GiB or more: 1024 sequences, 8192 tokens per step.
    assert (config.tp, config.max_num_seqs, config.max_num_batched_tokens, config.block_size,
            config.kv_cache_dtype) == (1, 1024, 8192, 16, "auto")


@pytest.mark.parametrize(("argv", "message"), [
    (["vllm", "serve", "some/Unknown-Model"], "unknown model 'some/Unknown-Model'; known: "),
    (["vllm", "serve", "amd/MiniMax-M3-MXFP4", "-tp", "four"], "tp: 'four' is not a number"),
    (["vllm", "serve", "amd/MiniMax-M3-MXFP4", "-tp", "0"], "tp must be >= 1"),
    (["vllm", "serve"], "no model"),
    (["vllm", "serve", "amd/MiniMax-M3-MXFP4", "--speculative-config", "{oops"], "not JSON"),
    ([*ATOM_ARGV, "--method", "eagle3"], "needs the number of speculative tokens"),
])
def test_bad_argv_is_a_clear_error(argv: list[str], message: str) -> None:
    with pytest.raises((ArgvError, CatalogError), match=message.replace("(", r"\(")):
        engine_config_from_argv(argv, hardware="MI355X")


def test_unknown_hardware_lists_the_known() -> None:
    with pytest.raises(CatalogError, match="unknown hardware 'A100'; known: B200"):
        engine_config_from_argv(ATOM_ARGV, hardware="A100")


def test_sglang_draft_tokens_count_the_verified_token() -> None:
    config, _ = engine_config_from_argv(
        ["python3", "-m", "sglang.launch_server", "--model-path", "amd/MiniMax-M3-MXFP4",
         "--speculative-algorithm", "EAGLE3", "--speculative-num-draft-tokens", "4",
         "--speculative-draft-model-path", "Inferact/MiniMax-M3-EAGLE3"], hardware="MI355X")
    assert config.spec is not None and config.spec.num_speculative_tokens == 3
