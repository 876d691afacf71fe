"""Server-side latency histograms (the vLLM and SGLang personas), measured on the simulated
server's clock.

vLLM exports `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds` (one
observation per output chunk after the first, i.e. per engine iteration) and
`vllm:e2e_request_latency_seconds` with these bucket edges. The simulator observes the same
quantities from each finished request's trace, so a client can compare its own view with the
server's. SGLang exports the same three under its own names (its registry entry's
`latency_histograms`); the simulator gives them vLLM's bucket edges.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import HistogramMetricFamily

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from .timeline import RequestTrace

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass
class Histogram:
    edges: Sequence[float]
    counts: list[int] = field(default_factory=list)  # per bucket, +Inf last; not cumulative
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.edges) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.edges, value)] += 1
        self.total += value

    def family(self, name: str, doc: str, model: str) -> HistogramMetricFamily:
        cumulative, buckets = 0, []
        for edge, count in zip([*map(str, self.edges), "+Inf"], self.counts, strict=True):
            cumulative += count
            buckets.append((edge, cumulative))
        family = HistogramMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([model], buckets, sum_value=self.total)
        return family


@dataclass
class LatencyHistograms:
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))

    def observe(self, trace: RequestTrace) -> None:
        """Record a request that finished normally."""
        if trace.outcome != "finished" or not trace.emissions or trace.finish is None:
            return
        times = [t for t, _ in trace.emissions]
        self.ttft.observe(times[0] - trace.arrival)
        for before, after in itertools.pairwise(times):
            self.itl.observe(after - before)
        self.e2e.observe(trace.finish - trace.arrival)

    def families(self, names: Mapping[str, str], model: str) -> Iterator[HistogramMetricFamily]:
        """The histograms under the persona's names (its registry entry's
        `latency_histograms`: ttft, itl, e2e)."""
        yield self.ttft.family(names["ttft"], "Time to first token, server side.", model)
        yield self.itl.family(names["itl"], "Time between output chunks, server side.", model)
        yield self.e2e.family(names["e2e"], "Arrival to finish, server side.", model)
