"""A server's own latency histograms over one point, and how the client's view compares.

A server that exports Prometheus latency histograms (vLLM's TTFT, inter-token latency and
end-to-end latency) counts every request it served. The difference of two scrapes, one before
and one after the measured phase, is the histogram of that phase alone. Its mean is exact
(`_sum / _count`); its median is an estimate, interpolated linearly inside the bucket that holds
it as Prometheus' `histogram_quantile` does, so it lies in the same bucket as the true median and
is off by at most that bucket's width.

The client measures from before its request leaves to after a chunk arrives, the server from the
request's arrival to the chunk's send: the client's TTFT is the server's plus the transport
and its own scheduling. `client_vs_server` states the difference per point.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .record import mapping, number

if TYPE_CHECKING:
    from .record import JSONValue

# The quantities a framework's registry entry may name histograms for (`latency_histograms`),
# and the client's distribution each is compared with: the server's ITL counts one gap per
# engine iteration that streamed, as the client's ITL counts one per chunk; its TPOT (vLLM's)
# one value per request, as the client's does.
CLIENT_COUNTERPART = {"ttft": "ttft", "itl": "itl", "e2e": "e2el", "tpot": "tpot"}


@dataclass(frozen=True)
class HistogramDelta:
    """One histogram over a point: cumulative counts per upper bound (`+Inf` last), the count
    and the sum of its observations (seconds)."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    total: float

    @property
    def mean_s(self) -> float | None:
        return self.total / self.count if self.count > 0 else None

    def quantile_bucket(self, q: float) -> tuple[float, float] | None:
        """(lower, upper) bound of the bucket holding quantile `q`; None when nothing was
        observed or the quantile falls in `+Inf` (no upper bound to interpolate to)."""
        found = self._find(q)
        return None if found is None else (found[0], found[1])

    def quantile(self, q: float) -> float | None:
        """Prometheus' `histogram_quantile`: linear inside the bucket holding rank q * count;
        in the `+Inf` bucket, the largest finite bound (what Prometheus answers too)."""
        if not self.buckets or self.count <= 0:
            return None
        found = self._find(q)
        if found is None:
            finite = [le for le, _ in self.buckets if math.isfinite(le)]
            return finite[-1] if finite else None
        lower, upper, below, inside = found
        rank = q * self.count
        return lower + (upper - lower) * ((rank - below) / inside if inside else 0.0)

    def _find(self, q: float) -> tuple[float, float, float, float] | None:
        """(lower bound, upper bound, count below, count inside) of the bucket of rank q."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank and cumulative > below:
                if not math.isfinite(le):
                    return None
                return (min(lower, le), le, below, cumulative - below)
            lower, below = le, cumulative
        return None


def delta(before: Sequence[tuple[float, float]], after: Sequence[tuple[float, float]],
          count: tuple[float, float], total: tuple[float, float]) -> HistogramDelta:
    """The histogram of what happened between two scrapes: `after` minus `before`, bound by
    bound (a bound the first scrape lacked counted from zero)."""
    earlier = dict(before)
    buckets = tuple((le, n - earlier.get(le, 0.0)) for le, n in sorted(after))
    return HistogramDelta(buckets, count[1] - count[0], total[1] - total[0])


def summary(name: str, hist: HistogramDelta) -> dict[str, JSONValue]:
    """One histogram's part of a point's server metrics: its name, count, exact mean, median
    estimate with the bucket that holds it, and the bucket deltas themselves."""
    bucket = hist.quantile_bucket(0.5)
    return {
        "metric": name, "count": hist.count, "mean_s": hist.mean_s,
        "median_s": hist.quantile(0.5),
        "median_bucket_s": list(bucket) if bucket is not None else None,
        "buckets": [["+Inf" if not math.isfinite(le) else le, n] for le, n in hist.buckets],
    }


def client_vs_server(client: Mapping[str, JSONValue], server: Mapping[str, JSONValue]
                     ) -> dict[str, float]:
    """Client minus server, in ms, for the mean and the median of each quantity both have:
    `client` is a point's summary (`mean_ttft_ms`, ...), `server` its server metrics'
    `latency_histograms`. Positive: the client saw it later (transport, its own lag)."""
    out: dict[str, float] = {}
    for quantity, counterpart in CLIENT_COUNTERPART.items():
        hist = mapping(server.get(quantity))
        for stat in ("mean", "median"):
            theirs = number(hist.get(f"{stat}_s"))
            ours = number(client.get(f"{stat}_{counterpart}_ms"))
            if theirs is not None and ours is not None:
                out[f"{stat}_{counterpart}_ms"] = ours - theirs * 1000.0
    # What the comparison reads: the client's TPOT against the server's ITL, both the
    # time per token of a plain decode.
    itl = number(mapping(server.get("itl")).get("median_s"))
    tpot = number(client.get("median_tpot_ms"))
    if itl is not None and tpot is not None:
        out["median_tpot_vs_server_itl_ms"] = tpot - itl * 1000.0
    return out
