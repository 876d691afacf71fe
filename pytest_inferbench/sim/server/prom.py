"""`/metrics` and `/debug/mtp_stats` over the engine counters, with each persona's names.

A custom prometheus_client collector turns one `MetricsSnapshot` into the exposition: vLLM
(`vllm:*`, spec-decode counters per `vllm/v1/spec_decode/metrics.py`), ATOM (`atom:*` per
`atom/entrypoints/openai/metrics.py`, counters scraped as `..._total`) or SGLang (`sglang:*`).
Counters only ever grow; every value comes from the engine, none is estimated here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

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
    """One engine quantity: its kind and help text, how a snapshot gives it, and its name in
    each persona that exports it (vLLM, ATOM, SGLang). A series (`label`) is one sample per
    index of a tuple; a speculative fact is exported only while the engine drafts."""

    kind: str
    doc: str
    read: Callable[[MetricsSnapshot], float | tuple[int, ...]]
    names: Mapping[str, str]  # persona -> its name for the fact
    speculative: bool = False
    label: str = ""


# In exposition order; a persona exports the facts it has a name for.
_FACTS: tuple[_Fact, ...] = (
    _Fact("gauge", "Requests in the running batch.", lambda s: s.running,
          {"vllm": "vllm:num_requests_running", "atom": "atom:requests_running",
           "sglang": "sglang:num_running_reqs"}),
    _Fact("gauge", "Requests waiting to be scheduled.", lambda s: s.waiting,
          {"vllm": "vllm:num_requests_waiting", "atom": "atom:requests_waiting",
           "sglang": "sglang:num_queue_reqs"}),
    _Fact("gauge", "KV blocks in use.", lambda s: s.kv_blocks_used,
          {"atom": "atom:kv_cache_blocks_used"}),
    _Fact("gauge", "KV blocks free.", lambda s: s.kv_blocks_total - s.kv_blocks_used,
          {"atom": "atom:kv_cache_blocks_free"}),
    _Fact("gauge", "KV blocks.", lambda s: s.kv_blocks_total,
          {"atom": "atom:kv_cache_blocks_total"}),
    _Fact("gauge", "KV-cache usage, 1 = full.", lambda s: s.kv_usage,
          {"vllm": "vllm:kv_cache_usage_perc", "atom": "atom:kv_cache_usage_ratio",
           "sglang": "sglang:token_usage"}),
    _Fact("counter", "Prefill tokens processed.", lambda s: s.prompt_tokens,
          {"vllm": "vllm:prompt_tokens", "atom": "atom:prompt_tokens",
           "sglang": "sglang:prompt_tokens"}),
    _Fact("counter", "Generated tokens.", lambda s: s.generation_tokens,
          {"vllm": "vllm:generation_tokens", "atom": "atom:generation_tokens",
           "sglang": "sglang:generation_tokens"}),
    _Fact("counter", "Finished requests.", lambda s: s.requests_finished,
          {"vllm": "vllm:request_success", "atom": "atom:requests_finished",
           "sglang": "sglang:num_requests"}),
    _Fact("counter", "Preempted (retracted) requests.", lambda s: s.preemptions,
          {"vllm": "vllm:num_preemptions", "atom": "atom:preemptions",
           "sglang": "sglang:num_preemptions"}),
    _Fact("gauge", "Engine counters are available.", lambda s: 1,
          {"atom": "atom:metrics_snapshot_available"}),
    _Fact("counter", "Verify steps.", lambda s: s.verify_steps,
          {"vllm": "vllm:spec_decode_num_drafts"}, speculative=True),
    _Fact("counter", "Draft tokens proposed.", lambda s: s.draft_tokens,
          {"vllm": "vllm:spec_decode_num_draft_tokens", "atom": "atom:mtp_draft_tokens"},
          speculative=True),
    _Fact("counter", "Accepted draft tokens.", lambda s: s.accepted_tokens,
          {"vllm": "vllm:spec_decode_num_accepted_tokens", "atom": "atom:mtp_accepted_tokens"},
          speculative=True),
    _Fact("counter", "Accepted draft tokens by draft position.",
          lambda s: s.accepted_per_position,
          {"vllm": "vllm:spec_decode_num_accepted_tokens_per_pos"}, speculative=True,
          label="position"),
    _Fact("counter", "Verify steps by accepted draft tokens.", lambda s: s.accepted_histogram,
          {"atom": "atom:mtp_decode_steps"}, speculative=True, label="accepted_tokens"),
    _Fact("gauge", "Accepted / drafted.", lambda s: s.acceptance_rate,
          {"atom": "atom:mtp_acceptance_rate"}, speculative=True),
    _Fact("gauge", "Acceptance length: tokens per verify step.", lambda s: s.tokens_per_forward,
          {"atom": "atom:mtp_average_tokens_per_forward", "sglang": "sglang:spec_accept_length"},
          speculative=True),
)


def _families(persona: str, model: str, s: MetricsSnapshot) -> Iterator[Metric]:
    for fact in _FACTS:
        name = fact.names.get(persona)
        if name is None or (fact.speculative and not s.spec_tokens):
            continue
        value = fact.read(s)
        family = _family(fact.kind, name, fact.doc,
                         ["model_name", fact.label] if fact.label else ["model_name"])
        if isinstance(value, tuple):
            for index, count in enumerate(value):
                family.add_metric([model, str(index)], count)
        else:
            family.add_metric([model], value)
        yield family


class EngineCollector:
    """prometheus_client custom collector reading a fresh snapshot at every scrape."""

    def __init__(self, persona: str, model: str, snapshot: Callable[[], MetricsSnapshot],
                 latency: LatencyHistograms | None = None) -> None:
        if persona not in PERSONAS:
            raise ValueError(f"unknown persona {persona!r}: expected one of {', '.join(PERSONAS)}")
        self._persona = persona
        self._model = model
        self._snapshot = snapshot
        # Only vLLM's latency histogram names are known; other personas do not export them.
        self._latency = latency if persona == "vllm" else None

    def collect(self) -> Iterator[Metric]:
        yield from _families(self._persona, self._model, self._snapshot())
        if self._latency is not None:
            yield from self._latency.families(self._model)


def metrics_registry(persona: str, model: str, snapshot: Callable[[], MetricsSnapshot],
                     latency: LatencyHistograms | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(persona, model, snapshot, latency))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
