"""The real server's argv -> `EngineConfig`: ATOM, vLLM, SGLang and TensorRT-LLM spellings.

The simulated server reads exactly what the real one would get, so one launch spec drives both.
`--a_b` and `--a-b` are the same flag; `--flag=value` works; the argv may start with the
program words (`python3 -m atom.entrypoints.openai_server`, `vllm serve MODEL`,
`python -m sglang.launch_server`, `[mpirun ...] trtllm-serve MODEL`); TensorRT-LLM's
extra-options YAML comes from the launch spec's files (`sim/trtllm.py`). Flags the simulator
does not model are accepted and returned as "ignored" so the caller can report them once.
Speculative decoding is read by `specdecode.read_speculative_decoding`, the reader the gates use
too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..frameworks import registry, specdecode
from . import catalog, trtllm
from .acceptance import SpecConfig, distribution_from_position_rates
from .config import NATIVE_CONTEXT, EngineConfig
from .offload_args import HICACHE_FLAG, OFFLOAD_FIELDS, OffloadArgvError, read_kv_offload

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["ArgvError", "argv_value", "engine_config_from_argv", "framework_of_argv"]

# Flags that take no value (store_true / BooleanOptionalAction), canonical spelling.
BOOLEAN_FLAGS = frozenset({
    "enable-expert-parallel", "enable-dp-attention", "trust-remote-code", "enforce-eager",
    "no-enable-prefix-caching", "enable-prefix-caching", "disable-log-requests",
    "disable-log-stats", "enable-chunked-prefill", "no-enable-chunked-prefill",
    "disable-radix-cache", "enable-torch-compile", "disable-cuda-graph", "enable-ep-moe",
    "enable-metrics", "enable-mixed-chunk", "disable-custom-all-reduce", "async-scheduling",
    "no-async-scheduling", "enable-auto-tool-choice", "disable-uvicorn-access-log",
    HICACHE_FLAG,
})
# Forwards run eagerly, without CUDA/HIP graphs (vLLM / ATOM, SGLang).
EAGER_FLAGS = frozenset({"enforce-eager", "disable-cuda-graph"})
# The boolean flags the engine reads (parallelism, prefix caching, graphs).
ENGINE_FLAGS = frozenset({"enable-expert-parallel", "enable-dp-attention", "enable-ep-moe",
                          "enable-prefix-caching", "no-enable-prefix-caching",
                          "disable-radix-cache", HICACHE_FLAG}) | EAGER_FLAGS
# Served by the HTTP layer, not the engine: accepted, not reported as ignored.
SERVER_FLAGS = frozenset({"port", "server-port", "host", "served-model-name", "api-key"})
# canonical flag -> EngineConfig / spec field
ALIASES: dict[str, str] = {
    "model": "model", "model-path": "model",
    "tp": "tp", "tensor-parallel-size": "tp", "tp-size": "tp",
    "pp": "pp", "pipeline-parallel-size": "pp", "pp-size": "pp",
    "ep": "ep", "ep-size": "ep", "expert-parallel-size": "ep",
    "dp": "dp", "dp-size": "dp", "data-parallel-size": "dp",
    "max-num-seqs": "max_num_seqs", "max-running-requests": "max_num_seqs",
    "max-batch-size": "max_num_seqs", "max-seq-len": "max_model_len",
    "max-num-tokens": "max_num_batched_tokens",
    "kv-cache-free-gpu-memory-fraction": "kv_cache_free_fraction",
    "extra-llm-api-options": "trt_options", "config": "trt_options",
    "extra-engine-args": "trt_options",  # Dynamo's TensorRT-LLM worker
    "max-num-batched-tokens": "max_num_batched_tokens", "chunked-prefill-size":
    "max_num_batched_tokens",
    "block-size": "block_size", "page-size": "block_size",
    "gpu-memory-utilization": "gpu_memory_utilization", "mem-fraction-static":
    "gpu_memory_utilization",
    "kv-cache-dtype": "kv_cache_dtype",
    "max-total-tokens": "max_total_tokens", "num-gpu-blocks-override": "num_gpu_blocks",
    "max-model-len": "max_model_len", "context-length": "max_model_len",
    "online-quant-config": "online_quant",
    "sim-jitter": "jitter", "sim-seed": "seed",
    **OFFLOAD_FIELDS,  # the CPU-DRAM KV tier's flags (`offload_args.py`)
}
INT_FIELDS = {"tp", "pp", "ep", "dp", "max_num_seqs", "max_num_batched_tokens", "block_size",
              "max_model_len", "seed", "max_total_tokens", "num_gpu_blocks"}
FLOAT_FIELDS = {"gpu_memory_utilization", "jitter", "kv_cache_free_fraction"}


class ArgvError(ValueError):
    """A flag value the simulator cannot read; the message names the flag."""


@dataclass
class _Parsed:
    values: dict[str, Any]
    flags: set[str]
    ignored: list[str]
    positional: list[str]


def framework_of_argv(argv: Sequence[str]) -> str | None:
    found = registry.of_argv(argv)
    return found.name if found is not None else None


def _strip_program(argv: Sequence[str]) -> list[str]:
    """Drop `python3 -m module` / `vllm serve` so only the server's own arguments remain."""
    args = list(argv)
    programs = {p for f in registry.frameworks() for p in f.programs}
    if args and args[0].rsplit("/", 1)[-1] == "mpirun":
        # mpirun's own options first, then the program it starts.
        start = next((i for i, w in enumerate(args) if w.rsplit("/", 1)[-1] in programs),
                     len(args))
        args = args[start:]
    if args and ("python" in args[0].rsplit("/", 1)[-1]):
        args = args[1:]
        if args[:1] == ["-m"]:
            args = args[2:]
    elif args and args[0].rsplit("/", 1)[-1] in programs:
        args = args[1:]
        if args[:1] == ["serve"]:
            args = args[1:]
    return args


def _parse(args: list[str]) -> _Parsed:
    out = _Parsed({}, set(), [], [])
    speculative = specdecode.value_flags()  # read by specdecode, not ignored
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if not word.startswith("-") or word in {"-", "--"}:
            out.positional.append(word)
            continue
        name, eq, inline = word.lstrip("-").partition("=")
        name = name.replace("_", "-")
        value: str | None = inline if eq else None
        if value is None and name not in BOOLEAN_FLAGS and i < len(args) and (
                not args[i].startswith("-") or _is_number(args[i])):
            value = args[i]
            i += 1
        field = ALIASES.get(name)
        if field is not None:
            if value is None:
                raise ArgvError(f"--{name} needs a value")
            out.values[field] = value
        elif name in ENGINE_FLAGS:
            out.flags.add(name)
        elif name not in SERVER_FLAGS and name not in speculative:
            out.ignored.append(word if value is None or eq else f"{word} {value}")
    return out


def argv_value(argv: Sequence[str], field: str) -> int | float | str | None:
    """What a launch argv sets one field to (e.g. "max_model_len" from `--max-model-len` or
    `--context-length`), typed; None when the argv does not set it."""
    values = _parse(_strip_program(argv)).values
    return _typed({field: values[field]})[field] if field in values else None


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _typed(values: dict[str, Any]) -> dict[str, Any]:
    typed: dict[str, Any] = {}
    for key, raw in values.items():
        try:
            if key in INT_FIELDS:
                typed[key] = int(raw)
            elif key in FLOAT_FIELDS:
                typed[key] = float(raw)
            else:
                typed[key] = raw
        except ValueError:
            raise ArgvError(f"{key.replace('_', '-')}: {raw!r} is not a number") from None
    return typed


def _spec(argv: Sequence[str], env: Mapping[str, str],
          trt_options: Mapping[str, Any]) -> SpecConfig | None:
    try:
        described = specdecode.read_speculative_decoding(argv, env, trt_options)
    except specdecode.SpecDecodeArgvError as exc:
        raise ArgvError(str(exc)) from None
    if described is None:
        return None
    k = described.num_tokens
    if not k and described.method in {"mtp", "nextn", "deepseek_mtp"}:
        # ATOM `--method mtp` alone: one drafted token per step, the default of its
        # --num-speculative-tokens (assumption: ATOM's default, as vLLM's for MTP).
        k = 1
    if not k:
        raise ArgvError(f"speculative method {described.method!r} needs the number of "
                        "speculative tokens")
    dist = described.accepted_distribution
    if dist is None and described.position_rates is not None:
        dist = distribution_from_position_rates(described.position_rates)
    return SpecConfig(
        method=described.method, draft_model=described.draft_model,
        num_speculative_tokens=k,
        acceptance_length=described.acceptance_length,
        acceptance_rate=described.acceptance_rate, accepted_distribution=dist,
        thinking=described.thinking)


def engine_config_from_argv(argv: Sequence[str], *, hardware: str,
                            env: Mapping[str, str] | None = None,
                            framework: str | None = None,
                            files: Mapping[str, str] | None = None,
                            ) -> tuple[EngineConfig, list[str]]:
    """Parse a launch argv; returns the config and the flags the simulator ignores.

    `files` holds the config files the server reads (TensorRT-LLM's extra-options YAML)."""
    env = env or {}
    fw_name = framework or framework_of_argv(argv) or "vllm"
    fw = catalog.framework(fw_name)
    parsed = _parse(_strip_program(argv))
    v = _typed(parsed.values)
    options: dict[str, Any] = {}
    entry = registry.get(fw.name)
    if "trt_options" in v and not entry.options_file:
        parsed.ignored.append(f"--config {v.pop('trt_options')}")
    if "trt_options" in v:
        try:
            options = trtllm.read_options(v.pop("trt_options"), dict(files or {}))
        except trtllm.TrtOptionsError as exc:
            raise ArgvError(str(exc)) from None
        fields_from_file = trtllm.engine_fields(options)
        if fields_from_file.pop("dp_attn", False):
            parsed.flags.add("enable-dp-attention")
        # Flags on the command line win over the options file, as in trtllm-serve.
        v = {**_typed(fields_from_file), **v}
    model = v.get("model") or (parsed.positional[0] if parsed.positional else None)
    if not model:
        raise ArgvError("no model in the argv (--model M, or `vllm serve M`)")
    catalog.checkpoint(model)  # an unknown model fails here, listing the known ones
    tp, dp = v.get("tp", 1), v.get("dp", 1)
    dp_attn = "enable-dp-attention" in parsed.flags
    if dp_attn and dp == 1 and entry.dp_attention_needs_dp:
        dp_attn = False  # the server turns it off: attention stays tensor-parallel
        parsed.ignored.append("--enable-dp-attention (no --dp-size above 1: off)")
    if dp > 1 and entry.data_parallel_attention:
        # Data parallelism as vLLM runs it on an MoE model: dp x tp GPUs, attention split by
        # sequences (each DP rank runs its own requests), experts shared over all ranks.
        tp, dp_attn = tp * dp, True
    elif dp > 1 and not dp_attn:
        parsed.ignored.append(f"--data-parallel-size {dp} (independent replicas not modelled)")
    ep = v.get("ep", tp if parsed.flags & {"enable-expert-parallel", "enable-ep-moe"} else 1)
    quant = v.get("online_quant")
    defaults = fw.defaults_on(catalog.hardware(hardware))
    fields: dict[str, Any] = {
        key: v.get(key, defaults[key]) for key in
        ("max_num_seqs", "max_num_batched_tokens", "block_size", "gpu_memory_utilization",
         "kv_cache_dtype")}
    # Prefix caching is on unless turned off: vLLM / ATOM `--no-enable-prefix-caching`,
    # SGLang `--disable-radix-cache`, TensorRT-LLM `kv_cache_config.enable_block_reuse: false`.
    block_reuse = (options.get("kv_cache_config") or {}).get("enable_block_reuse", True)
    prefix_caching = (not parsed.flags & {"no-enable-prefix-caching", "disable-radix-cache"}
                      and block_reuse is not False)
    try:
        offload = read_kv_offload(v, parsed.flags, tp=v.get("tp", 1), env=env,
                                  files=files or {}, trt_options=options)
    except OffloadArgvError as exc:
        raise ArgvError(str(exc)) from None
    # SGLang `--max-total-tokens`, vLLM `--num-gpu-blocks-override`: a KV pool capped below
    # what the memory holds.
    pool_cap = v.get("max_total_tokens")
    if "num_gpu_blocks" in v:
        pool_cap = v["num_gpu_blocks"] * fields["block_size"]
    if v.get("max_model_len", 2) < 2:
        raise ArgvError(f"the context length must be >= 2 tokens, got {v['max_model_len']}")
    jitter = v.get("jitter", float(env.get("INFERBENCH_SIM_JITTER", "0") or 0))
    seed = v.get("seed", int(env.get("INFERBENCH_SIM_SEED", "0") or 0))
    try:
        config = EngineConfig(
            hardware=catalog.hardware(hardware).name, model=catalog.checkpoint(model).name,
            framework=fw.name, tp=tp, pp=v.get("pp", 1), ep=ep, dp_attn=dp_attn,
            max_model_len=v.get("max_model_len", NATIVE_CONTEXT),
            kv_cache_free_fraction=v.get("kv_cache_free_fraction"),
            online_quant="fp8" if quant and "fp8" in str(quant).lower() else None,
            spec=_spec(argv, env, options), prefix_caching=prefix_caching,
            kv_offload=offload if prefix_caching else None, max_total_tokens=pool_cap,
            cuda_graphs=not parsed.flags & EAGER_FLAGS, jitter=jitter,
            seed=seed, **fields)
    except ValueError as exc:
        if isinstance(exc, (ArgvError, catalog.CatalogError)):
            raise
        raise ArgvError(str(exc)) from None
    ignored = parsed.ignored + parsed.positional[1 if not v.get("model") else 0:]
    return config, ignored
