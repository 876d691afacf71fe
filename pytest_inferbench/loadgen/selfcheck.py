"""Is the client itself distorting the timings? Event-loop lag and process CPU during a point.

A ticker task asks to wake every `interval_s`; how late it wakes is the event-loop lag, which
is also how late a chunk that arrived meanwhile gets its timestamp. When the lag is large next
to the intervals being measured (the median chunk ITL, or the TTFT when there is no ITL), the
measurement is not trustworthy and the verdict says so, with the numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_INTERVAL_S = 0.005
# The p99 lag may be at most this fraction of the median interval being measured ...
MAX_LAG_FRACTION = 0.25
# ... but a lag under this is never a verdict (timer granularity, scheduler noise).
LAG_FLOOR_S = 0.002
HIGH_CPU_FRACTION = 0.9


@dataclass(frozen=True)
class LoopStats:
    lag_s: np.ndarray[Any, np.dtype[np.float64]]
    cpu_s: float
    wall_s: float

    @property
    def cpu_fraction(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


class LoopMonitor:
    """Start it inside the event loop before the point, stop it right after."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._lags: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._cpu0 = 0.0
        self._wall0 = 0.0

    async def _tick(self) -> None:
        stamp = time.perf_counter
        due = stamp() + self.interval_s
        while True:
            await asyncio.sleep(max(due - stamp(), 0.0))
            now = stamp()
            self._lags.append(now - due)
            due = now + self.interval_s

    def start(self) -> None:
        self._cpu0 = time.process_time()
        self._wall0 = time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._tick(), name="inferbench-lag")

    async def stop(self) -> LoopStats:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return LoopStats(lag_s=np.asarray(self._lags, dtype=np.float64),
                         cpu_s=time.process_time() - self._cpu0,
                         wall_s=time.perf_counter() - self._wall0)


def verdict(stats: LoopStats, *, median_itl_s: float, median_ttft_s: float,
            max_lag_fraction: float = MAX_LAG_FRACTION,
            lag_floor_s: float = LAG_FLOOR_S) -> dict[str, Any]:
    """The `client_check` dict: ok, reason, lag statistics (ms), CPU."""
    lag = stats.lag_s
    reference = median_itl_s if median_itl_s > 0 else median_ttft_s
    limit = max(lag_floor_s, max_lag_fraction * reference)
    p50, p99, worst = (np.percentile(lag, [50, 99, 100]) if lag.size else (0.0, 0.0, 0.0))
    check: dict[str, Any] = {
        "ok": True,
        "reason": "",
        "lag_samples": int(lag.size),
        "lag_p50_ms": float(p50) * 1000,
        "lag_p99_ms": float(p99) * 1000,
        "lag_max_ms": float(worst) * 1000,
        "lag_limit_ms": limit * 1000,
        "reference_interval_ms": reference * 1000,
        "cpu_fraction": stats.cpu_fraction,
        "wall_s": stats.wall_s,
    }
    if p99 > limit:
        what = "median chunk ITL" if median_itl_s > 0 else "median TTFT"
        check["ok"] = False
        check["reason"] = (
            f"client event-loop lag p99 {p99 * 1000:.2f} ms exceeds {limit * 1000:.2f} ms "
            f"({max_lag_fraction:.0%} of the {what} {reference * 1000:.2f} ms): the client may "
            f"have distorted the timings (client CPU {stats.cpu_fraction:.0%} of one core)")
    elif stats.cpu_fraction > HIGH_CPU_FRACTION:
        check["warning"] = f"client CPU {stats.cpu_fraction:.0%} of one core"
    return check
