"""TensorRT-LLM's `trtllm-serve` options: the argv flags and the extra-options YAML.

`trtllm-serve MODEL --tp_size N --ep_size N --max_batch_size B --max_num_tokens T
--max_seq_len L --extra_llm_api_options FILE` (the InferenceX scripts write FILE next to the
server). From the YAML (TensorRT-LLM `LlmArgs`): `kv_cache_config.dtype`,
`kv_cache_config.free_gpu_memory_fraction` (a fraction of the memory left *after* the weights,
unlike vLLM's fraction of all HBM), `kv_cache_config.tokens_per_block`, `enable_attention_dp`,
`max_batch_size` / `max_num_tokens`, and `speculative_config` with `decoding_type` MTP
(`num_nextn_predict_layers` or `max_draft_len` = drafted tokens) or Eagle / Eagle3 (`max_draft_len`,
`speculative_model_dir`).
"""

from __future__ import annotations

from typing import Any

import yaml

from ..util.yamllines import load_data

OPTIONS_FLAGS = ("extra-llm-api-options", "config")
# TensorRT-LLM defaults (LlmArgs / KvCacheConfig): 0.9 of free memory, 32 tokens per block.
DEFAULT_FREE_FRACTION = 0.9
DEFAULT_TOKENS_PER_BLOCK = 32


class TrtOptionsError(ValueError):
    """The extra-options YAML is missing or malformed; the message names the file."""


def read_options(name: str, files: dict[str, str]) -> dict[str, Any]:
    """The extra-options mapping the argv points at, from the launch spec's files."""
    text = files.get(name) or files.get(name.rsplit("/", 1)[-1])
    if text is None:
        raise TrtOptionsError(f"--extra_llm_api_options {name}: no such file in the launch "
                              f"spec (files: {', '.join(sorted(files)) or 'none'})")
    try:
        data = load_data(text) or {}
    except yaml.YAMLError as exc:
        raise TrtOptionsError(f"{name}: YAML syntax error: {exc}") from None
    if not isinstance(data, dict):
        raise TrtOptionsError(f"{name}: expected a mapping of LLM API options")
    return data


def engine_fields(options: dict[str, Any]) -> dict[str, Any]:
    """EngineConfig fields the options YAML sets (its `speculative_config` is read by
    `specdecode.read_speculative_decoding`, the one reader of speculative decoding)."""
    out: dict[str, Any] = {}
    kv = options.get("kv_cache_config") or {}
    if "dtype" in kv:
        out["kv_cache_dtype"] = str(kv["dtype"])
    out["kv_cache_free_fraction"] = float(kv.get("free_gpu_memory_fraction",
                                                 DEFAULT_FREE_FRACTION))
    out["block_size"] = int(kv.get("tokens_per_block", DEFAULT_TOKENS_PER_BLOCK))
    if "max_batch_size" in options:
        out["max_num_seqs"] = int(options["max_batch_size"])
    if "max_num_tokens" in options:
        out["max_num_batched_tokens"] = int(options["max_num_tokens"])
    if "pipeline_parallel_size" in options:
        out["pp"] = int(options["pipeline_parallel_size"])
    if options.get("enable_attention_dp"):
        out["dp_attn"] = True
    return out
