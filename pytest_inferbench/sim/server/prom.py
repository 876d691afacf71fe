"""`/metrics` and `/debug/mtp_stats` over the engine counters, with each persona's names.

A custom prometheus_client collector turns one `MetricsSnapshot` into the exposition: the
quantities of `quantities.yaml`, each under the persona's name for it in the persona's framework
registry entry (`frameworks/entries/<persona>.yaml`): vLLM (`vllm:*`, spec-decode counters
per `vllm/v1/spec_decode/metrics.py`), ATOM (`atom:*` per `atom/entrypoints/openai/metrics.py`,
counters scraped as `..._total`), SGLang (`sglang:*`), or any registered framework's.
Counters only ever grow; every value comes from the engine, none is estimated here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# `registry` alone would read as the prometheus CollectorRegistry this module builds.
from ...frameworks import registry as framework_registry

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from prometheus_client.core import Metric

    from .engine_loop import EngineLike
    from .prom_latency import LatencyHistograms

@dataclass(frozen=True)
class MetricsSnapshot:
    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    prompt_tokens: int
    generation_tokens: int
    requests_finished: int
    preemptions: int
    spec_tokens: int  # k drafts per verify step; 0 without speculative decoding
    verify_steps: int  # sequence-steps that verified drafts ("num_drafts")
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...]  # length k
    accepted_histogram: tuple[int, ...]  # sequence-steps by accepted drafts 0..k
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, found cached
    # The CPU-DRAM KV tier (exported only with one): `EngineCounters`' host_* and offload_*.
    host_tier: bool = False
    host_cache_queries: int = 0
    host_cache_hits: int = 0
    host_tokens_used: int = 0
    host_tokens_total: int = 0
    offload_bytes_written: int = 0
    offload_bytes_read: int = 0
    offload_seconds_written: float = 0.0
    offload_seconds_read: float = 0.0

    @property
    def kv_blocks_free(self) -> int:
        return self.kv_blocks_total - self.kv_blocks_used

    @property
    def available(self) -> int:
        """ATOM's `metrics_snapshot_available`: 1, the counters come from the engine."""
        return 1

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def device_cache_hits(self) -> int:
        """Prompt tokens found in HBM, beside those found in DRAM (SGLang's `device` source)."""
        return self.prefix_cache_hits

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries \
            else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Acceptance length: 1 + accepted drafts per verify step (the bonus token counts)."""
        return 1.0 + self.accepted_tokens / self.verify_steps if self.verify_steps else 0.0


def snapshot_from_engine(engine: EngineLike) -> MetricsSnapshot:
    """Read the engine's counters (`Engine.counters()`, `Engine.k`) into a snapshot."""
    c = engine.counters()
    k = int(engine.k)
    return MetricsSnapshot(
        running=c.num_requests_running, waiting=c.num_requests_waiting,
        kv_blocks_used=c.kv_blocks_used, kv_blocks_total=c.kv_blocks_total,
        prompt_tokens=c.prompt_tokens, generation_tokens=c.generation_tokens,
        requests_finished=c.requests_finished, preemptions=c.preemptions, spec_tokens=k,
        verify_steps=c.spec_num_drafts, draft_tokens=c.spec_num_draft_tokens,
        accepted_tokens=c.spec_num_accepted_tokens,
        accepted_per_position=tuple(c.spec_accepted_per_pos) if k else (),
        accepted_histogram=tuple(c.spec_accepted_histogram) if k else (),
        prefix_cache_queries=c.prefix_cache_queries, prefix_cache_hits=c.prefix_cache_hits,
        host_tier=c.host_tier, host_cache_queries=c.host_cache_queries,
        host_cache_hits=c.host_cache_hits, host_tokens_used=c.host_tokens_used,
        host_tokens_total=c.host_tokens_total, offload_bytes_written=c.offload_bytes_written,
        offload_bytes_read=c.offload_bytes_read,
        offload_seconds_written=c.offload_seconds_written,
        offload_seconds_read=c.offload_seconds_read,
    )


def mtp_stats(snapshot: MetricsSnapshot) -> dict[str, object]:
    """ATOM's `/debug/mtp_stats` body."""
    steps = sum(snapshot.accepted_histogram)
    return {
        "enabled": snapshot.spec_tokens > 0,
        "total_draft_tokens": snapshot.draft_tokens,
        "total_accepted_tokens": snapshot.accepted_tokens,
        "acceptance_rate": snapshot.acceptance_rate,
        "average_tokens_per_forward": snapshot.tokens_per_forward,
        "distribution": {str(k): n for k, n in enumerate(snapshot.accepted_histogram)},
        "distribution_percent": {
            str(k): (100.0 * n / steps if steps else 0.0)
            for k, n in enumerate(snapshot.accepted_histogram)},
        "simulated": True,
    }


def _family(kind: str, name: str, doc: str,
            labels: list[str]) -> CounterMetricFamily | GaugeMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


@dataclass(frozen=True)
class _Fact:
    """One engine quantity of `quantities.yaml` (its comment says what each part means)."""

    snapshot: str  # the `MetricsSnapshot` attribute that gives it
    kind: str
    doc: str
    speculative: bool
    offload: bool  # exported only while the engine has a CPU-DRAM tier
    series: str


@cache
def _facts() -> tuple[_Fact, ...]:
    text = resources.files(__package__).joinpath("quantities.yaml").read_text(encoding="utf-8")
    return tuple(_Fact(snapshot=d["snapshot"], kind=d["kind"], doc=d["help"],
                       speculative=bool(d.get("speculative", False)),
                       offload=bool(d.get("offload", False)), series=d.get("series", ""))
                 for d in yaml.safe_load(text))


def _families(names: Mapping[str, str], model: str, s: MetricsSnapshot) -> Iterator[Metric]:
    # A name with a `{label="value"}` is one series of its family: the quantities that share
    # a family are its series (`sglang:cached_tokens` by `cache_source`).
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    for fact in _facts():
        name = names.get(fact.snapshot)
        if name is None or (fact.speculative and not s.spec_tokens) or (
                fact.offload and not s.host_tier):
            continue
        value: float | tuple[int, ...] = getattr(s, fact.snapshot)
        family_name, label = framework_registry.split_metric(name)
        labels = ["model_name", *([fact.series] if fact.series else []),
                  *([label[0]] if label else [])]
        family = families.get(family_name)
        if family is None:
            family = families[family_name] = _family(fact.kind, family_name, fact.doc, labels)
        fixed = [label[1]] if label else []
        if isinstance(value, tuple):
            for index, count in enumerate(value):
                family.add_metric([model, str(index), *fixed], count)
        else:
            family.add_metric([model, *fixed], value)
    yield from families.values()


class EngineCollector:
    """prometheus_client custom collector reading a fresh snapshot at every scrape."""

    def __init__(self, persona: str, model: str, snapshot: Callable[[], MetricsSnapshot],
                 latency: LatencyHistograms | None = None) -> None:
        known = framework_registry.personas()
        if persona not in known:
            raise ValueError(f"unknown persona {persona!r}: expected one of {', '.join(known)}")
        self._names = framework_registry.get(persona).metrics
        self._model = model
        self._snapshot = snapshot
        # Only a persona whose entry names latency histograms exports them.
        self._histogram_names = framework_registry.get(persona).latency_histograms
        self._latency = latency if self._histogram_names else None

    def collect(self) -> Iterator[Metric]:
        yield from _families(self._names, self._model, self._snapshot())
        if self._latency is not None:
            yield from self._latency.families(self._histogram_names, self._model)


def metrics_registry(persona: str, model: str, snapshot: Callable[[], MetricsSnapshot],
                     latency: LatencyHistograms | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(persona, model, snapshot, latency))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
