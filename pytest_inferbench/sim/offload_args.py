"""A launch's CPU-DRAM KV tier -> `KVOffload`: each offload backend's own flags, as the real
server reads them (InferenceX `kv-offloading: dram`; agentic.md §6.2).

- SGLang HiCache: `--enable-hierarchical-cache` with `--hicache-size` (GB of host memory per
  rank, 1e9 bytes as SGLang's host pool counts them) or else `--hicache-ratio` (host pool =
  ratio x the HBM pool, SGLang's default 2); `--hicache-write-policy write_back` writes only
  on eviction, the `write_through*` policies as blocks are computed.
- vLLM `--kv-transfer-config` JSON: `SimpleCPUOffloadConnector` (`cpu_bytes_to_use_per_rank`,
  or `cpu_bytes_to_use` over all TP ranks; `lazy_offload: true` writes on eviction only),
  `OffloadingConnector` (`cpu_bytes_to_use` over all ranks), `MooncakeStoreConnector`
  (`global_segment_size` per rank: in the connector's extra config, else
  `MOONCAKE_GLOBAL_SEGMENT_SIZE`, else the JSON `MOONCAKE_CONFIG_PATH` names; `"300GB"` is
  GiB, as Mooncake parses sizes), LMCache connectors and ATOM's `lmcache_offload`
  (`LMCACHE_MAX_LOCAL_CPU_SIZE` GiB per rank, LMCache's default 5). Other connectors (NIXL,
  P2P) move KV between instances: no tier.
- vLLM `--kv-offloading-backend native|lmcache --kv-offloading-size` (GiB over all TP ranks).
- TensorRT-LLM `kv_cache_config.host_cache_size` (bytes per rank) in its options YAML.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .config import KVOffload

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["OFFLOAD_FIELDS", "read_kv_offload"]

# canonical flag -> the field `args._parse` files its value under (values read here only)
OFFLOAD_FIELDS: dict[str, str] = {
    "hicache-size": "hicache_size", "hicache-ratio": "hicache_ratio",
    "hicache-write-policy": "hicache_write_policy", "kv-transfer-config": "kv_transfer_config",
    "kv-offloading-backend": "kv_offloading_backend",
    "kv-offloading-size": "kv_offloading_size",
}
HICACHE_FLAG = "enable-hierarchical-cache"
GB, GIB = 10**9, 2**30
SGLANG_DEFAULT_HICACHE_RATIO = 2.0  # sglang server_args: hicache_ratio
LMCACHE_DEFAULT_CPU_GIB = 5.0  # LMCache config: max_local_cpu_size
# Connectors that move KV between instances (disaggregation), not to a host tier.
TRANSFER_ONLY = ("nixl", "p2p", "mori", "mooncakeconnector")


class OffloadArgvError(ValueError):
    """An offload flag's value the simulator cannot read; the message names it."""


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise OffloadArgvError(f"{what}: {value!r} is not a number")
    try:
        number = float(value)
    except ValueError:
        raise OffloadArgvError(f"{what}: {value!r} is not a number") from None
    if number < 0:
        raise OffloadArgvError(f"{what}: {value!r} is negative")
    return number


def _size_bytes(value: object, what: str) -> float:
    """Mooncake's sizes: bytes, or a string with a GB / MB suffix (`"300GB"`)."""
    if isinstance(value, str):
        text = value.strip().upper()
        for suffix, unit in (("GB", GIB), ("MB", 2**20), ("KB", 2**10)):
            if text.endswith(suffix):
                return _number(text[:-len(suffix)], what) * unit
    return _number(value, what)


def _hicache(values: Mapping[str, str]) -> KVOffload:
    policy = values.get("hicache_write_policy", "write_through")
    size = _number(values.get("hicache_size", 0), "--hicache-size")
    ratio = _number(values.get("hicache_ratio", SGLANG_DEFAULT_HICACHE_RATIO), "--hicache-ratio")
    return KVOffload("hicache", bytes_per_rank=int(size * GB), hbm_ratio=0.0 if size else ratio,
                     write_through=policy != "write_back")


def _lmcache(env: Mapping[str, str]) -> KVOffload:
    gib = _number(env.get("LMCACHE_MAX_LOCAL_CPU_SIZE", LMCACHE_DEFAULT_CPU_GIB),
                  "LMCACHE_MAX_LOCAL_CPU_SIZE")
    return KVOffload("lmcache", bytes_per_rank=int(gib * GIB))


def _mooncake_segment(extra: Mapping[str, Any], env: Mapping[str, str],
                      files: Mapping[str, str]) -> object:
    """Mooncake's per-rank segment: the connector's extra config, else
    `MOONCAKE_GLOBAL_SEGMENT_SIZE`, else the JSON `MOONCAKE_CONFIG_PATH` names."""
    if "global_segment_size" in extra:
        return extra["global_segment_size"]
    if "MOONCAKE_GLOBAL_SEGMENT_SIZE" in env:
        return env["MOONCAKE_GLOBAL_SEGMENT_SIZE"]
    path = env.get("MOONCAKE_CONFIG_PATH")
    if not path or path not in files:
        raise OffloadArgvError(
            "MooncakeStoreConnector: no DRAM size (expected global_segment_size in "
            "kv_connector_extra_config, MOONCAKE_GLOBAL_SEGMENT_SIZE, or the JSON file "
            "MOONCAKE_CONFIG_PATH names among the launch spec's files)")
    try:
        config = json.loads(files[path])
    except json.JSONDecodeError:
        raise OffloadArgvError(f"{path}: not JSON (MOONCAKE_CONFIG_PATH)") from None
    if not isinstance(config, dict):
        raise OffloadArgvError(f"{path}: not a JSON object (MOONCAKE_CONFIG_PATH)")
    return config.get("global_segment_size", 0)


def _connector(text: str, tp: int, env: Mapping[str, str], files: Mapping[str, str]
               ) -> KVOffload | None:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OffloadArgvError(f"--kv-transfer-config: not JSON ({exc.msg})") from None
    if not isinstance(config, dict):
        raise OffloadArgvError("--kv-transfer-config: expected a JSON object")
    name = str(config.get("kv_connector", ""))
    extra = config.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise OffloadArgvError("--kv-transfer-config: kv_connector_extra_config is not an object")
    lowered = name.lower()
    if lowered == "simplecpuoffloadconnector":
        if "cpu_bytes_to_use_per_rank" in extra:
            per_rank = _number(extra["cpu_bytes_to_use_per_rank"], "cpu_bytes_to_use_per_rank")
        else:
            per_rank = _number(extra.get("cpu_bytes_to_use", 0), "cpu_bytes_to_use") / tp
        lazy = str(extra.get("lazy_offload", False)).lower() == "true"
        return KVOffload("vllm-simple", bytes_per_rank=int(per_rank), write_through=not lazy)
    if lowered == "offloadingconnector":
        total = _number(extra.get("cpu_bytes_to_use", 0), "cpu_bytes_to_use")
        return KVOffload("vllm-native", bytes_per_rank=int(total / tp))
    if lowered == "mooncakestoreconnector":
        return KVOffload("mooncake", bytes_per_rank=int(_size_bytes(
            _mooncake_segment(extra, env, files), "global_segment_size")))
    if "lmcache" in lowered:
        return _lmcache(env)
    if any(word in lowered for word in TRANSFER_ONLY):
        return None
    raise OffloadArgvError(f"--kv-transfer-config: kv_connector {name!r} is not modelled "
                           "(expected SimpleCPUOffloadConnector, OffloadingConnector, "
                           "MooncakeStoreConnector, an LMCache connector or a transfer one)")


def read_kv_offload(values: Mapping[str, str], flags: set[str], *, tp: int,
                    env: Mapping[str, str], files: Mapping[str, str],
                    trt_options: Mapping[str, Any]) -> KVOffload | None:
    """The tier the argv (its offload fields and flags), env and config files ask for."""
    if HICACHE_FLAG in flags:
        return _hicache(values)
    backend = values.get("kv_offloading_backend")
    if backend is not None:
        gib = _number(values.get("kv_offloading_size", 0), "--kv-offloading-size")
        name = "vllm-native" if backend == "native" else backend
        if name not in ("vllm-native", "lmcache"):
            raise OffloadArgvError(f"--kv-offloading-backend {backend!r} (expected native or "
                                   "lmcache)")
        return KVOffload(name, bytes_per_rank=int(gib * GIB / tp))
    if "kv_transfer_config" in values:
        return _connector(values["kv_transfer_config"], tp, env, files)
    kv = trt_options.get("kv_cache_config") or {}
    host = kv.get("host_cache_size") if isinstance(kv, dict) else None
    if host:
        # TensorRT-LLM offloads a block to host memory when it evicts it from the GPU pool.
        return KVOffload("native", bytes_per_rank=int(_number(host, "host_cache_size")),
                         write_through=False)
    return None
