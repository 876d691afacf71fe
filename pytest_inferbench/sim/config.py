"""`EngineConfig`: everything that decides how the simulated engine behaves, frozen."""

from __future__ import annotations

from dataclasses import dataclass

from . import catalog
from .acceptance import SpecConfig
from .efficiency import Efficiency

__all__ = ["NATIVE_CONTEXT", "EngineConfig", "KVOffload", "SpecConfig"]

# `max_model_len` when the launch names no context length: the engines then serve the model's
# native context (its HF config), which the catalog holds per checkpoint.
NATIVE_CONTEXT = 0


@dataclass(frozen=True)
class KVOffload:
    """A CPU-DRAM KV tier below HBM (InferenceX `kv-offloading: dram`), sized as the launch
    argv sizes it (`sim/offload_args.py`)."""

    backend: str  # hicache, vllm-simple, vllm-native, mooncake, lmcache, native (TensorRT-LLM)
    bytes_per_rank: int = 0  # DRAM one GPU's share of the tier holds
    # SGLang `--hicache-ratio` (no `--hicache-size`): the tier holds ratio x the HBM pool.
    hbm_ratio: float = 0.0
    # Blocks are copied to DRAM as their prefill completes (HiCache `write_through*`, vLLM's
    # simple connector without lazy offload), not only when HBM evicts them.
    write_through: bool = True

    def __post_init__(self) -> None:
        if self.bytes_per_rank < 0 or self.hbm_ratio < 0:
            raise ValueError(f"{self.backend}: a KV-offload size must be >= 0")


@dataclass(frozen=True)
class EngineConfig:
    hardware: str  # catalog name, e.g. "MI355X"
    model: str  # checkpoint name, e.g. "amd/MiniMax-M3-MXFP4"
    framework: str = "atom"  # a registry name (frameworks/entries/)
    tp: int = 1
    # Pipeline stages (vLLM `--pipeline-parallel-size`, SGLang `--pp-size`, TensorRT-LLM
    # `pipeline_parallel_size`): a worker is tp x pp GPUs, each stage layers/pp of the model.
    pp: int = 1
    ep: int = 1  # expert-parallel degree (= tp when --enable-expert-parallel)
    dp_attn: bool = False
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    max_model_len: int = NATIVE_CONTEXT  # resolved to the checkpoint's native context
    # TensorRT-LLM: the KV cache takes this fraction of the memory left after the weights
    # (`kv_cache_config.free_gpu_memory_fraction`) instead of gpu_memory_utilization x HBM.
    kv_cache_free_fraction: float | None = None
    # The KV pool capped at this many tokens (SGLang `--max-total-tokens`, vLLM
    # `--num-gpu-blocks-override` x block size); None: what the memory holds.
    max_total_tokens: int | None = None
    online_quant: str | None = None  # "fp8": bf16 linear layers quantized at load (ATOM ptpc_fp8)
    # Full prompt blocks reused by content (vLLM/ATOM `--enable-prefix-caching`, on by default
    # in vLLM V1; SGLang's radix cache unless `--disable-radix-cache`; TensorRT-LLM
    # `kv_cache_config.enable_block_reuse`). Only requests that carry block hashes use it.
    prefix_caching: bool = True
    spec: SpecConfig | None = None
    kv_offload: KVOffload | None = None  # a CPU-DRAM tier below the prefix cache's HBM blocks
    # Forwards run as CUDA/HIP graphs (the frameworks' default); False under vLLM / ATOM
    # `--enforce-eager`, SGLang `--disable-cuda-graph`.
    cuda_graphs: bool = True
    jitter: float = 0.0  # sigma of a multiplicative lognormal per-step jitter (0 = none)
    seed: int = 0
    # A calibration's knobs in place of the framework profile's (`sim/calibrate/`); None: the
    # profile's. `calibration` names where they came from, for logs and records.
    efficiency: Efficiency | None = None
    calibration: str | None = None

    @property
    def gpus(self) -> int:
        """GPUs one worker runs on: tp per pipeline stage, pp stages."""
        return self.tp * self.pp

    def __post_init__(self) -> None:
        if self.max_model_len == NATIVE_CONTEXT:
            object.__setattr__(self, "max_model_len", catalog.checkpoint(self.model).context)
        checks = [
            (self.tp >= 1, f"tp must be >= 1, got {self.tp}"),
            (self.pp >= 1, f"pp must be >= 1, got {self.pp}"),
            (self.ep >= 1, f"ep must be >= 1, got {self.ep}"),
            (self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}"),
            (self.max_num_batched_tokens >= 1,
             f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"),
            (self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}"),
            (0.0 < self.gpu_memory_utilization <= 1.0,
             f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"),
            (self.max_model_len >= 2, f"max_model_len must be >= 2, got {self.max_model_len}"),
            (0.0 <= self.jitter <= 0.3, f"jitter must be in [0, 0.3], got {self.jitter}"),
            (self.max_total_tokens is None or self.max_total_tokens >= 1,
             f"max_total_tokens must be >= 1, got {self.max_total_tokens}"),
        ]
        if self.spec is not None:
            checks.append((self.spec.num_speculative_tokens >= 1,
                           "num_speculative_tokens must be >= 1"))
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
