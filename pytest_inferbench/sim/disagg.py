"""A multinode deployment: its worker pools, its router and the prefill -> decode KV transfer.

Description and physics only (no clock, no I/O); `sim/cluster.py` runs it. A disaggregated
deployment has a prefill pool and a decode pool, each of `workers` instances of the ordinary
engine with the pool's own TP/EP/DP-attention on its own GPUs; an aggregated multinode one
(InferenceX `decode.num-worker: 0`) has one pool whose instances serve whole requests.

KV transfer (docs/simulator.md, "Disaggregated serving"): when a prompt's prefill completes,
its KV cache moves from the prefill instance's GPUs to the decode instance's. Each GPU sends
and receives its own share over its own link, in parallel: the time is the larger per-GPU
share over one GPU's link -- the scale-up fabric when the whole deployment fits in one
NVLink / Infinity Fabric domain (an NVL72 rack holds 72 GPUs), else the RDMA NIC -- at the
framework's transfer efficiency, plus a fixed latency. Under DP attention a sequence's KV lives
on one rank, so that rank moves all of it. Engines that send each prefill chunk's KV as the
chunk completes (`kv_transfer.overlap`) leave only what did not fit under the prefill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..frameworks import registry
from . import catalog
from .config import EngineConfig
from .physics import ModelOnGpus, shard_model

ROLES = ("prefill", "decode", "aggregated")
ROUTER_POLICIES = ("round-robin", "random", "load-aware")


class DeploymentError(ValueError):
    """A deployment that cannot be built (pools of different models, an unknown router)."""


@dataclass(frozen=True)
class Pool:
    """`workers` identical engine instances of one role; `config.gpus` GPUs each."""

    role: str
    config: EngineConfig
    workers: int

    @property
    def gpus(self) -> int:
        return self.workers * self.config.gpus

    @property
    def shape(self) -> str:
        c = self.config
        return (f"{self.workers}x{c.tp}" + (f"ep{c.ep}" if c.ep > 1 else "")
                + (f"pp{c.pp}" if c.pp > 1 else "")
                + ("dpa" if c.dp_attn else ""))


@dataclass(frozen=True)
class Deployment:
    """Prefill and decode pools (decode None: the first pool's workers serve whole requests)."""

    prefill: Pool
    decode: Pool | None = None
    router: str = "round-robin"

    def __post_init__(self) -> None:
        if self.router not in ROUTER_POLICIES:
            raise DeploymentError(f"router policy {self.router!r} unknown; known: "
                                  f"{', '.join(ROUTER_POLICIES)}")
        pools = [p for p in (self.prefill, self.decode) if p is not None]
        for pool in pools:
            if pool.workers < 1:
                raise DeploymentError(f"{pool.role} pool: {pool.workers} workers (expected >= 1)")
        if self.decode is not None and (
                self.decode.config.model != self.prefill.config.model
                or self.decode.config.hardware != self.prefill.config.hardware):
            raise DeploymentError("prefill and decode pools must serve the same model on the "
                                  "same hardware")

    @property
    def disaggregated(self) -> bool:
        return self.decode is not None

    @property
    def gpus(self) -> int:
        return self.prefill.gpus + (self.decode.gpus if self.decode else 0)

    @property
    def pools(self) -> tuple[Pool, ...]:
        return (self.prefill,) + ((self.decode,) if self.decode else ())

    @property
    def topology(self) -> str:
        """`p1x8ep8dpa-d2x8` (or `agg2x8` when aggregated)."""
        if self.decode is None:
            return f"agg{self.prefill.shape}"
        return f"p{self.prefill.shape}-d{self.decode.shape}"


def worker_link_bytes_per_s(config: EngineConfig) -> float:
    """What one worker's collectives run over: its scale-up fabric when the worker fits in one
    domain, else the NIC (a TP16 worker of two 8-GPU nodes all-reduces over RDMA)."""
    hw = catalog.hardware(config.hardware)
    return hw.link_bytes_per_s if config.tp <= hw.scaleup_gpus else hw.nic_bytes_per_s


@dataclass(frozen=True)
class KvTransfer:
    """The cost of moving one prompt's KV cache from a prefill to a decode instance."""

    bytes_per_token: float  # the larger per-GPU share, sender or receiver, per prompt token
    bytes_per_seq: float  # per-sequence state (sliding windows, recurrent state) per GPU
    link_bytes_per_s: float  # one GPU's link at the framework's transfer efficiency
    latency_s: float
    overlap: bool  # each prefill chunk's KV leaves as the chunk completes
    chunk_tokens: int  # the prefill instance's chunk (its max_num_batched_tokens)
    fabric: str  # "scale-up" or "rdma"

    def seconds(self, prompt_tokens: int, prefill_span_s: float = 0.0) -> float:
        """Transfer time after the prefill completes; `prefill_span_s` is how long the
        prompt's chunks took from the first one's start (what an overlapped transfer hides
        under)."""
        wire = (self.bytes_per_token * prompt_tokens + self.bytes_per_seq) / self.link_bytes_per_s
        if self.overlap and prompt_tokens > self.chunk_tokens:
            last = (prompt_tokens - 1) % self.chunk_tokens + 1
            wire = max(wire * last / prompt_tokens, wire - prefill_span_s)
        return self.latency_s + wire


def _kv_share(config: EngineConfig, model: ModelOnGpus, whole: ModelOnGpus
              ) -> tuple[float, float]:
    """Bytes per token and per sequence one GPU of this pool holds of one sequence (a
    pipeline stage's GPUs hold its 1/pp of the layers)."""
    if config.dp_attn:  # the sequence lives on one attention rank, all its KV there
        return whole.kv_store_per_token / config.pp, whole.kv_store_per_seq / config.pp
    return model.kv_store_per_token / config.pp, model.kv_store_per_seq / config.pp


def kv_transfer(deployment: Deployment) -> KvTransfer | None:
    """The transfer of a disaggregated deployment (None when aggregated)."""
    if deployment.decode is None:
        return None
    hw = catalog.hardware(deployment.prefill.config.hardware)
    ckpt = catalog.checkpoint(deployment.prefill.config.model)
    shares = []
    for pool in (deployment.prefill, deployment.decode):
        c = pool.config
        model = shard_model(ckpt, hw, tp=c.tp, dp_attn=c.dp_attn, kv_dtype=c.kv_cache_dtype,
                            online_quant=c.online_quant)
        whole = shard_model(ckpt, hw, tp=1, dp_attn=False, kv_dtype=c.kv_cache_dtype,
                            online_quant=c.online_quant)
        shares.append(_kv_share(c, model, whole))
    fw = catalog.framework(deployment.prefill.config.framework)
    # Workers are packed into as few scale-up domains as the deployment needs; within one
    # domain the KV moves over NVLink / Infinity Fabric, else over the RDMA NICs.
    same_domain = deployment.gpus <= hw.scaleup_gpus
    link = hw.link_bytes_per_s if same_domain else hw.nic_bytes_per_s
    return KvTransfer(
        bytes_per_token=max(s[0] for s in shares), bytes_per_seq=max(s[1] for s in shares),
        link_bytes_per_s=link * fw.kv_transfer_efficiency, latency_s=fw.kv_transfer_latency_s,
        overlap=fw.kv_transfer_overlap,
        chunk_tokens=deployment.prefill.config.max_num_batched_tokens,
        fabric="scale-up" if same_domain else "rdma")


class Router:
    """Picks the prefill and the decode instance of a request when it arrives.

    round-robin: each pool in turn (Dynamo's frontend default, vLLM's disaggregation proxy);
    random: a seeded uniform pair (SGLang's mini load balancer); load-aware: the prefill
    instance with the fewest prompt tokens not yet prefilled and the decode instance with the
    fewest requests assigned, ties in turn.
    """

    def __init__(self, policy: str, n_prefill: int, n_decode: int, seed: int = 0) -> None:
        if policy not in ROUTER_POLICIES:
            raise DeploymentError(f"router policy {policy!r} unknown; known: "
                                  f"{', '.join(ROUTER_POLICIES)}")
        self.policy = policy
        self.sizes = (n_prefill, n_decode)
        self._turn = [0, 0]
        self._rng = np.random.default_rng(seed)

    def pick(self, pool: int, loads: list[float]) -> int:
        n = self.sizes[pool]
        if n == 1:
            return 0
        if self.policy == "random":
            return int(self._rng.integers(n))
        start = self._turn[pool]
        if self.policy == "round-robin":
            choice = start
        else:
            best = math.inf
            choice = start
            for k in range(n):
                i = (start + k) % n
                if loads[i] < best:
                    best, choice = loads[i], i
        self._turn[pool] = (choice + 1) % n
        return choice


# Router flags and their values (Dynamo `--router-mode`, SGLang / vLLM routers `--policy`).
ROUTER_FLAGS = ("--router-mode", "--policy")
ROUTER_WORDS = {"round-robin": "round-robin", "round_robin": "round-robin",
                "roundrobin": "round-robin", "random": "random", "kv": "load-aware",
                "cache_aware": "load-aware", "cache-aware": "load-aware",
                "least-loaded": "load-aware", "least_load": "load-aware",
                "power_of_two": "load-aware", "load-aware": "load-aware"}


def router_policy_of_argv(argv: tuple[str, ...] | list[str]) -> str | None:
    """The router policy a router's argv sets (`--router-mode kv`: load-aware), or None."""
    words = list(argv)
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if flag in ROUTER_FLAGS:
            value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            policy = ROUTER_WORDS.get(value.lower())
            if policy is None:
                raise DeploymentError(f"{flag} {value!r}: unknown router policy (known: "
                                      f"{', '.join(sorted(ROUTER_WORDS))})")
            return policy
    return None


def default_router(framework: str) -> str:
    """The router policy InferenceX's deployment of a recipe framework runs by default (its
    registry entry's `multinode`, or the engine's own `router`)."""
    return registry.default_router(framework)


def engine_framework(framework: str) -> str:
    """The serving engine of a recipe framework: `dynamo-trt` -> trt, `sglang-disagg` ->
    sglang."""
    return registry.engine_of(framework)
