"""Is the client itself distorting the timings? Event-loop lag and process CPU during a point.

A ticker task asks to wake every `interval_s`; how late it wakes is the event-loop lag, which
is also how late a chunk that arrived meanwhile gets its timestamp. When the lag is large next
to the intervals being measured (the median chunk ITL, or the TTFT when there is no ITL), the
measurement is not trustworthy and the verdict says so, with the numbers. The stalls themselves
are listed with their times, so a late stamp can be traced to the stall that caused it.

Percentiles over ticks weigh a stall by its count, not its length: a 2 s stall is one tick, as
many 2 ms ones are. So the stalls (lags of at least LAG_FLOOR_S) are also judged by time: the
point fails when they add up to more than MAX_STALLED_SHARE of its duration, or when the longest
lasts longer than MAX_STALL_E2EL_FRACTION of the median request (E2EL), the point's latency
scale: the requests in flight across it measured the client, not the server.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..results.metrics import FloatArray, first_send
from ..util.aio import cancel_and_wait

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..results.metrics import RequestRecord
    from ..results.record import JSONValue

DEFAULT_INTERVAL_S = 0.002  # short enough to land inside the stalls it is looking for
# Typical lag (p90) may be at most this fraction of the median interval being measured ...
MAX_TYPICAL_LAG_FRACTION = 0.25
# ... and rare lag (p99) at most the whole interval, or it reshapes the tail percentiles.
MAX_TAIL_LAG_FRACTION = 1.0
# A lag under this is never a verdict (timer granularity, scheduler noise).
LAG_FLOOR_S = 0.002
# The client may spend at most this share of each slot's time between requests: more and it
# did not keep the concurrency in flight.
MAX_DISPATCH_SHARE = 0.05
# The stalls may add up to at most this share of the point's duration ...
MAX_STALLED_SHARE = 0.10
# ... and the longest may last at most this fraction of the median E2EL.
MAX_STALL_E2EL_FRACTION = 1.0
HIGH_CPU_FRACTION = 0.9
# The verdict lists stalls (lags of at least LAG_FLOOR_S) with their times; on a machine so busy
# that there are more, the longest are kept.
MAX_STALLS_LISTED = 500


@dataclass(frozen=True)
class LoopStats:
    lag_s: FloatArray
    cpu_s: float
    wall_s: float
    # When each wake-up was due (perf_counter): the loop was unresponsive from due_s to
    # due_s + lag_s.
    due_s: FloatArray

    @property
    def cpu_fraction(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


class LoopMonitor:
    """Start it inside the event loop before the point, stop it right after."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._lags: list[float] = []
        self._dues: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._cpu0 = 0.0
        self._wall0 = 0.0

    async def _tick(self) -> None:
        stamp = time.perf_counter
        due = stamp() + self.interval_s
        while True:
            await asyncio.sleep(max(due - stamp(), 0.0))
            now = stamp()
            self._dues.append(due)
            self._lags.append(now - due)
            due = now + self.interval_s

    def start(self) -> None:
        self._cpu0 = time.process_time()
        self._wall0 = time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._tick(), name="inferbench-lag")

    async def stop(self) -> LoopStats:
        await cancel_and_wait(self._task)
        return LoopStats(lag_s=np.asarray(self._lags, dtype=np.float64),
                         cpu_s=time.process_time() - self._cpu0,
                         wall_s=time.perf_counter() - self._wall0,
                         due_s=np.asarray(self._dues, dtype=np.float64))


def verdict(stats: LoopStats, *, median_itl_s: float, median_ttft_s: float,
            median_e2el_s: float = 0.0, dispatch_delay_s: FloatArray | None = None,
            busy_s: float = 0.0, origin_s: float = 0.0) -> dict[str, JSONValue]:
    """The `client_check` dict: ok, reason, lag statistics (ms), dispatch delay, CPU, stalls.

    `dispatch_delay_s` holds, per request, how long the client took from deciding to send it
    to having it on the wire; `busy_s` is the summed E2EL of the requests. `stalls` lists
    `[start, lag]` pairs: seconds from `origin_s` (the point's first send) and milliseconds.
    A `median_e2el_s` of 0 (no successful request) leaves the longest stall unjudged. Only
    the lag from `origin_s` on is judged (`measured_part`).
    """
    cpu_fraction = stats.cpu_fraction  # the client's CPU over the whole monitored window
    stats = measured_part(stats, origin_s)
    lag = stats.lag_s
    reference = median_itl_s if median_itl_s > 0 else median_ttft_s
    what = "median chunk ITL" if median_itl_s > 0 else "median TTFT"
    typical_limit = max(LAG_FLOOR_S, MAX_TYPICAL_LAG_FRACTION * reference)
    tail_limit = max(LAG_FLOOR_S, MAX_TAIL_LAG_FRACTION * reference)
    p50, p90, p99, worst = (np.percentile(lag, [50, 90, 99, 100]) if lag.size
                            else (0.0, 0.0, 0.0, 0.0))
    stall_lags = lag[lag >= LAG_FLOOR_S]
    stalled_s = float(stall_lags.sum())
    stalled_share = stalled_s / stats.wall_s if stats.wall_s > 0 else 0.0
    longest = float(stall_lags.max()) if stall_lags.size else 0.0
    longest_limit = MAX_STALL_E2EL_FRACTION * median_e2el_s
    delays = dispatch_delay_s if dispatch_delay_s is not None else np.zeros(0)
    waited = float(delays.sum())
    share = waited / (waited + busy_s) if waited + busy_s > 0 else 0.0
    check: dict[str, JSONValue] = {
        "ok": True,
        "reason": "",
        "lag_samples": int(lag.size),
        "lag_p50_ms": float(p50) * 1000,
        "lag_p90_ms": float(p90) * 1000,
        "lag_p99_ms": float(p99) * 1000,
        "lag_max_ms": float(worst) * 1000,
        "lag_p90_limit_ms": typical_limit * 1000,
        "lag_p99_limit_ms": tail_limit * 1000,
        "reference_interval_ms": reference * 1000,
        "stalled_s": stalled_s,
        "stalled_share": stalled_share,
        "stalled_share_limit": MAX_STALLED_SHARE,
        "longest_stall_limit_ms": longest_limit * 1000,
        "dispatch_delay_p50_ms": float(np.median(delays)) * 1000 if delays.size else 0.0,
        "dispatch_delay_p99_ms": float(np.percentile(delays, 99)) * 1000 if delays.size else 0.0,
        "dispatch_share": share,
        "cpu_fraction": cpu_fraction,
        "wall_s": stats.wall_s,
        "stalls": _stalls(stats, origin_s),
    }
    reasons = []
    if p90 > typical_limit:
        reasons.append(f"client event-loop lag p90 {p90 * 1000:.2f} ms exceeds "
                       f"{typical_limit * 1000:.2f} ms ({MAX_TYPICAL_LAG_FRACTION:.0%} of the "
                       f"{what} {reference * 1000:.2f} ms)")
    if p99 > tail_limit:
        reasons.append(f"client event-loop lag p99 {p99 * 1000:.2f} ms exceeds the {what} "
                       f"{reference * 1000:.2f} ms")
    if stalled_share > MAX_STALLED_SHARE:
        reasons.append(f"the client's event loop stalled for {stalled_s:.2f} s in all, "
                       f"{stalled_share:.0%} of the point's {stats.wall_s:.2f} s (limit "
                       f"{MAX_STALLED_SHARE:.0%})")
    if longest_limit > 0 and longest > longest_limit:
        reasons.append(f"the client's longest event-loop stall {longest * 1000:.0f} ms exceeds "
                       f"{longest_limit * 1000:.0f} ms ({MAX_STALL_E2EL_FRACTION:.0%} of the "
                       "median E2EL)")
    if share > MAX_DISPATCH_SHARE:
        reasons.append(f"the client spent {share:.1%} of the time between requests dispatching "
                       f"(limit {MAX_DISPATCH_SHARE:.0%}): fewer requests were in flight than "
                       "the concurrency")
    if reasons:
        check["ok"] = False
        check["reason"] = ("; ".join(reasons) + f": the client may have distorted the timings "
                           f"(client CPU {cpu_fraction:.0%} of one core)")
    elif cpu_fraction > HIGH_CPU_FRACTION:
        check["warning"] = f"client CPU {cpu_fraction:.0%} of one core"
    return check


def measured_part(stats: LoopStats, origin_s: float) -> LoopStats:
    """The lag from `origin_s` (the measured phase's first send) on: a tick that woke before it
    delayed no measured timestamp (the loop was busy with the warmup or with parsing the
    server's /metrics before the phase: 15-33 ms for the real-engine tier's vLLM, 132 kB), and
    of one that spans it only the part after counts. Wall time is counted from the origin too;
    `cpu_s` stays the whole window's, so `verdict` reads the client's CPU share before this. An
    origin of 0: all of it."""
    if origin_s <= 0 or not stats.lag_s.size:
        return stats
    woke = stats.due_s + stats.lag_s
    after = woke > origin_s
    due = np.maximum(stats.due_s[after], origin_s)
    # The monitor stopped after the load ended: its wall time less the part before the origin.
    before_s = max(origin_s - float(stats.due_s[0]), 0.0)
    return LoopStats(lag_s=woke[after] - due, cpu_s=stats.cpu_s,
                     wall_s=max(stats.wall_s - before_s, 0.0), due_s=due)


def _stalls(stats: LoopStats, origin_s: float) -> list[JSONValue]:
    """The lags of at least LAG_FLOOR_S as [start (s from origin), lag (ms)], in time order."""
    lag, due = stats.lag_s, stats.due_s
    stalled = np.flatnonzero(lag >= LAG_FLOOR_S)
    if stalled.size > MAX_STALLS_LISTED:
        stalled = np.sort(stalled[np.argsort(lag[stalled])[-MAX_STALLS_LISTED:]])
    return [[float(due[i] - origin_s), float(lag[i]) * 1000] for i in stalled]


def point_verdict(stats: LoopStats, records: Sequence[RequestRecord], *,
                  time_scale: float | None) -> dict[str, JSONValue]:
    """`verdict` over a point's request records, as every HTTP load (fixed-length or a trace
    replay) judges its client; against a simulator at time scale 0 it says the gaps were no
    timings to distort."""
    median_itl, median_ttft, median_e2el = median_gaps(records)
    check = verdict(stats, median_itl_s=median_itl, median_ttft_s=median_ttft,
                    median_e2el_s=median_e2el, dispatch_delay_s=dispatch_delays(records),
                    busy_s=sum(r.end_time - r.send_time for r in records),
                    origin_s=first_send(records))
    if time_scale == 0:
        check["not_applicable"] = ("the server streams as fast as it can (simulator at time "
                                   "scale 0): its gaps are not timings to distort")
    return check


def median_gaps(records: Sequence[RequestRecord]) -> tuple[float, float, float]:
    """Median chunk ITL, TTFT and E2EL of the successful records (0 when there are none)."""
    ok = [r for r in records if r.success and len(r.chunk_times)]
    if not ok:
        return 0.0, 0.0, 0.0
    ttft = np.fromiter((r.chunk_times[0] - r.send_time for r in ok), np.float64, len(ok))
    e2el = np.fromiter((r.end_time - r.send_time for r in ok), np.float64, len(ok))
    gaps = [np.diff(r.chunk_times) for r in ok if len(r.chunk_times) > 1]
    itl = float(np.median(np.concatenate(gaps))) if gaps else 0.0
    return itl, float(np.median(ttft)), float(np.median(e2el))


def dispatch_delays(records: Sequence[RequestRecord]) -> FloatArray:
    return np.asarray([r.send_time - r.dispatch_time for r in records
                       if r.dispatch_time is not None], dtype=np.float64)
