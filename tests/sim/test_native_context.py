"""With no context flag the simulated engine serves the model's native context.

vLLM, SGLang, ATOM and TensorRT-LLM derive the context from the model's HF config when the
launch names none; the expected lengths below are the published ones (catalog/models.yaml
cites each source). A context flag still wins, and the catalog refuses an architecture
without a valid `context`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pytest_inferbench.sim import catalog
from pytest_inferbench.sim.args import ArgvError, engine_config_from_argv
from pytest_inferbench.sim.config import EngineConfig
from pytest_inferbench.sim.engine import Engine, RequestRejectedError


@pytest.mark.parametrize(("argv", "hardware", "native"), [
    (["vllm", "serve", "deepseek-ai/DeepSeek-V4-Pro", "--tensor-parallel-size", "8"],
     "B200", 1_048_576),
    (["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3.5-397B-A17B-FP8",
      "--tp", "8"], "B200", 262_144),
    (["python3", "-m", "atom.entrypoints.openai_server", "--model", "amd/MiniMax-M3-MXFP4",
      "-tp", "4"], "MI355X", 1_048_576),
    (["trtllm-serve", "openai/gpt-oss-120b", "--tp_size", "1"], "B200", 131_072),
    (["vllm", "serve", "deepseek-ai/DeepSeek-R1-0528", "-tp", "8"], "H200", 163_840),
])
def test_no_context_flag_gives_the_models_native_context(argv: list[str], hardware: str,
                                                         native: int) -> None:
    config, _ = engine_config_from_argv(argv, hardware=hardware)
    assert config.max_model_len == native
    assert config.max_model_len == catalog.checkpoint(config.model).context


def test_a_checkpoint_with_its_own_context_differs_from_its_architecture() -> None:
    # GLM-5.2 shares GLM-5's architecture but serves 1M tokens; GLM-5 serves 202752.
    argv = ["vllm", "serve", "{model}", "-tp", "8"]
    glm5, _ = engine_config_from_argv([w.format(model="zai-org/GLM-5-FP8") for w in argv],
                                      hardware="B200")
    glm52, _ = engine_config_from_argv([w.format(model="zai-org/GLM-5.2-FP8") for w in argv],
                                       hardware="B200")
    assert (glm5.max_model_len, glm52.max_model_len) == (202_752, 1_048_576)


@pytest.mark.parametrize("flag", ["--max-model-len", "--context-length", "--max-seq-len"])
def test_a_context_flag_still_wins(flag: str) -> None:
    config, _ = engine_config_from_argv(
        ["vllm", "serve", "deepseek-ai/DeepSeek-V4-Pro", "-tp", "8", flag, "40000"],
        hardware="B200")
    assert config.max_model_len == 40_000
    with pytest.raises(RequestRejectedError, match="maximum context length is 40000"):
        Engine(config).add_request(0, 39_990, 20)


def test_an_explicit_context_below_two_tokens_is_refused() -> None:
    with pytest.raises(ArgvError, match="context length must be >= 2"):
        engine_config_from_argv(["vllm", "serve", "openai/gpt-oss-120b", "--max-model-len",
                                 "0"], hardware="B200")


def test_an_engine_config_without_a_context_takes_the_checkpoints() -> None:
    config = EngineConfig(hardware="B200", model="openai/gpt-oss-120b", framework="vllm")
    assert config.max_model_len == catalog.checkpoint("openai/gpt-oss-120b").context


def test_the_native_context_reserves_no_more_kv_cache() -> None:
    argv = ["vllm", "serve", "deepseek-ai/DeepSeek-R1-0528", "-tp", "8"]
    native, _ = engine_config_from_argv(argv, hardware="H200")
    capped, _ = engine_config_from_argv([*argv, "--max-model-len", "32768"], hardware="H200")
    assert Engine(native).num_blocks == Engine(capped).num_blocks
    # A prompt within the context but beyond the KV cache is still refused, for the cache.
    small, _ = engine_config_from_argv([*argv, "--num-gpu-blocks-override", "1000"],
                                       hardware="H200")
    engine = Engine(small)
    too_big = engine.num_blocks * engine.block_size + 1
    assert too_big < small.max_model_len
    with pytest.raises(RequestRejectedError, match="exceeds the KV cache"):
        engine.add_request(0, too_big, 1)


@pytest.fixture
def patched_models(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The real models.yaml, copied so one test can break an entry; lookups uncached."""
    real = catalog._load("models.yaml")
    data: dict[str, Any] = {key: dict(value) if isinstance(value, dict) else value
                            for key, value in real.items()}
    data["architectures"] = {k: dict(v) for k, v in real["architectures"].items()}
    data["checkpoints"] = {k: dict(v) for k, v in real["checkpoints"].items()}
    monkeypatch.setattr(catalog, "_load", lambda name: data if name == "models.yaml"
                        else real)
    catalog.architecture.cache_clear()
    catalog.checkpoint.cache_clear()
    yield data
    catalog.architecture.cache_clear()
    catalog.checkpoint.cache_clear()


@pytest.mark.parametrize(("value", "message"), [
    (None, "architecture gpt-oss-120b has no `context`"),
    ("128k", "architecture gpt-oss-120b: `context` must be a whole number"),
    (1, "architecture gpt-oss-120b: `context` must be a whole number"),
    (True, "architecture gpt-oss-120b: `context` must be a whole number"),
])
def test_the_catalog_validates_an_architectures_context(
        patched_models: dict[str, Any], value: object, message: str) -> None:
    arch = patched_models["architectures"]["gpt-oss-120b"]
    arch.pop("context")
    if value is not None:
        arch["context"] = value
    with pytest.raises(catalog.CatalogError, match=message):
        catalog.checkpoint("openai/gpt-oss-120b")


def test_the_catalog_validates_a_checkpoints_context(patched_models: dict[str, Any]) -> None:
    patched_models["checkpoints"]["openai/gpt-oss-120b"]["context"] = -5
    with pytest.raises(catalog.CatalogError, match="checkpoint openai/gpt-oss-120b: `context`"):
        catalog.checkpoint("openai/gpt-oss-120b")
