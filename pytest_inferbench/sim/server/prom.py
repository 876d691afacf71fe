"""`/metrics` and `/debug/mtp_stats` over the engine counters, with each persona's names.

A custom prometheus_client collector turns one `MetricsSnapshot` into the exposition: vLLM
(`vllm:*`, spec-decode counters per `vllm/v1/spec_decode/metrics.py`), ATOM (`atom:*` per
`atom/entrypoints/openai/metrics.py`, counters scraped as `..._total`) or SGLang (`sglang:*`).
Counters only ever grow; every value comes from the engine, none is estimated here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from prometheus_client.core import Metric

    from .engine_loop import EngineLike
    from .prom_latency import LatencyHistograms

PERSONAS = ("atom", "vllm", "sglang")


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

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

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
    )


def mtp_stats(snapshot: MetricsSnapshot) -> dict[str, Any]:
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


def _family(kind: str, name: str, doc: str, labels: list[str]) -> Any:
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


class _Builder:
    def __init__(self, model: str) -> None:
        self.model = model
        self.families: list[Metric] = []

    def add(self, kind: str, name: str, doc: str, value: float,
            extra: dict[str, str] | None = None) -> None:
        extra = extra or {}
        family = _family(kind, name, doc, ["model_name", *extra])
        family.add_metric([self.model, *extra.values()], value)
        self.families.append(family)

    def add_series(self, kind: str, name: str, doc: str, label: str,
                   values: tuple[int, ...]) -> None:
        family = _family(kind, name, doc, ["model_name", label])
        for index, value in enumerate(values):
            family.add_metric([self.model, str(index)], value)
        self.families.append(family)


def _vllm(s: MetricsSnapshot, b: _Builder) -> None:
    b.add("gauge", "vllm:num_requests_running", "Requests in the running batch.", s.running)
    b.add("gauge", "vllm:num_requests_waiting", "Requests waiting to be scheduled.", s.waiting)
    b.add("gauge", "vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full.", s.kv_usage)
    b.add("counter", "vllm:prompt_tokens", "Prefill tokens processed.", s.prompt_tokens)
    b.add("counter", "vllm:generation_tokens", "Generated tokens.", s.generation_tokens)
    b.add("counter", "vllm:request_success", "Finished requests.", s.requests_finished)
    b.add("counter", "vllm:num_preemptions", "Preempted requests.", s.preemptions)
    if s.spec_tokens:
        b.add("counter", "vllm:spec_decode_num_drafts", "Verify steps.", s.verify_steps)
        b.add("counter", "vllm:spec_decode_num_draft_tokens", "Draft tokens.", s.draft_tokens)
        b.add("counter", "vllm:spec_decode_num_accepted_tokens", "Accepted draft tokens.",
              s.accepted_tokens)
        b.add_series("counter", "vllm:spec_decode_num_accepted_tokens_per_pos",
                     "Accepted draft tokens by draft position.", "position",
                     s.accepted_per_position)


def _atom(s: MetricsSnapshot, b: _Builder) -> None:
    b.add("gauge", "atom:requests_running", "Requests in the running batch.", s.running)
    b.add("gauge", "atom:requests_waiting", "Requests waiting to be scheduled.", s.waiting)
    b.add("gauge", "atom:kv_cache_blocks_used", "KV blocks in use.", s.kv_blocks_used)
    b.add("gauge", "atom:kv_cache_blocks_free", "KV blocks free.",
          s.kv_blocks_total - s.kv_blocks_used)
    b.add("gauge", "atom:kv_cache_blocks_total", "KV blocks.", s.kv_blocks_total)
    b.add("gauge", "atom:kv_cache_usage_ratio", "KV-cache usage, 1 = full.", s.kv_usage)
    b.add("counter", "atom:requests_finished", "Finished requests.", s.requests_finished)
    b.add("counter", "atom:prompt_tokens", "Prefill tokens processed.", s.prompt_tokens)
    b.add("counter", "atom:generation_tokens", "Generated tokens.", s.generation_tokens)
    b.add("counter", "atom:preemptions", "Preempted requests.", s.preemptions)
    b.add("gauge", "atom:metrics_snapshot_available", "Engine counters are available.", 1)
    if s.spec_tokens:
        b.add("counter", "atom:mtp_draft_tokens", "Draft tokens proposed.", s.draft_tokens)
        b.add("counter", "atom:mtp_accepted_tokens", "Draft tokens accepted.", s.accepted_tokens)
        b.add_series("counter", "atom:mtp_decode_steps",
                     "Verify steps by accepted draft tokens.", "accepted_tokens",
                     s.accepted_histogram)
        b.add("gauge", "atom:mtp_acceptance_rate", "Accepted / drafted.", s.acceptance_rate)
        b.add("gauge", "atom:mtp_average_tokens_per_forward", "Tokens per verify step.",
              s.tokens_per_forward)


def _sglang(s: MetricsSnapshot, b: _Builder) -> None:
    b.add("gauge", "sglang:num_running_reqs", "Requests in the running batch.", s.running)
    b.add("gauge", "sglang:num_queue_reqs", "Requests waiting to be scheduled.", s.waiting)
    b.add("gauge", "sglang:token_usage", "KV-cache usage, 1 = full.", s.kv_usage)
    b.add("counter", "sglang:prompt_tokens", "Prefill tokens processed.", s.prompt_tokens)
    b.add("counter", "sglang:generation_tokens", "Generated tokens.", s.generation_tokens)
    b.add("counter", "sglang:num_requests", "Finished requests.", s.requests_finished)
    b.add("counter", "sglang:num_preemptions", "Preempted (retracted) requests.", s.preemptions)
    if s.spec_tokens:
        b.add("gauge", "sglang:spec_accept_length", "Mean acceptance length.",
              s.tokens_per_forward)


_WRITERS: dict[str, Callable[[MetricsSnapshot, _Builder], None]] = {
    "vllm": _vllm, "atom": _atom, "sglang": _sglang}


class EngineCollector:
    """prometheus_client custom collector reading a fresh snapshot at every scrape."""

    def __init__(self, persona: str, model: str, snapshot: Callable[[], MetricsSnapshot],
                 latency: LatencyHistograms | None = None) -> None:
        if persona not in _WRITERS:
            raise ValueError(f"unknown persona {persona!r}: expected one of {', '.join(PERSONAS)}")
        self._write = _WRITERS[persona]
        self._model = model
        self._snapshot = snapshot
        # Only vLLM's latency histogram names are known; other personas do not export them.
        self._latency = latency if persona == "vllm" else None

    def collect(self) -> Iterator[Metric]:
        builder = _Builder(self._model)
        self._write(self._snapshot(), builder)
        yield from builder.families
        if self._latency is not None:
            yield from self._latency.families(self._model)


def metrics_registry(persona: str, model: str, snapshot: Callable[[], MetricsSnapshot],
                     latency: LatencyHistograms | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(persona, model, snapshot, latency))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
