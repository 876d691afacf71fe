"""A server gauge (KV-cache usage) sampled while a point runs, not read once after it.

A gauge read after the load has ended says what an idle server holds (nothing); the point's
KV usage is what it held while the requests ran. The sampler reads `/metrics` on its own
connection (the scrape client, not the load's pool) every `interval_s`, one scrape in flight at
a time (the next waits for the last), each bounded by the interval, and hands the parse to a
worker thread so the event loop that times the requests is not held by it. It keeps a running
count, sum and peak, so a long point costs no memory.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from ..util.aio import cancel_and_wait
from .scrape import MissingPrometheusParser, kv_usage_gauges, read_gauge

if TYPE_CHECKING:
    from ..results.record import JSONValue

SAMPLE_INTERVAL_S = 1.0


@dataclass(frozen=True)
class GaugeSamples:
    gauge: str | None  # the name the server exports it under; None: no sample read it
    count: int
    total: float
    peak: float | None
    failed: int  # scrapes that failed or timed out
    interval_s: float
    # A page was read and held none of the names: the server does not export the gauge, and
    # the sampling stopped there.
    not_exported: bool = False

    def describe(self, key: str) -> dict[str, JSONValue]:
        """`<key>_peak`, `<key>_mean` (None without a sample), the sample count and source."""
        return {
            f"{key}_peak": self.peak,
            f"{key}_mean": self.total / self.count if self.count else None,
            f"{key}_samples": self.count,
            f"{key}_failed_samples": self.failed,
            f"{key}_gauge": self.gauge,
            f"{key}_sampled": "not exported by the server" if self.not_exported
            else f"during the point, every {self.interval_s:g} s",
        }


class GaugeSampler:
    """Samples the first of `names` the server exports (default: every KV-usage gauge of the
    framework registry) from `start()` until `stop()`."""

    def __init__(self, client: httpx.AsyncClient, names: tuple[str, ...] | None = None,
                 interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self._client = client
        self._names = names if names is not None else kv_usage_gauges()
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._gauge: str | None = None
        self._count = 0
        self._total = 0.0
        self._peak: float | None = None
        self._failed = 0
        self._not_exported = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="inferbench-gauge-sampler")

    async def stop(self) -> GaugeSamples:
        """End the sampling (a scrape in flight is dropped: the load it would see has ended)."""
        await cancel_and_wait(self._task)
        self._task = None
        return GaugeSamples(self._gauge, self._count, self._total, self._peak, self._failed,
                            self._interval_s, self._not_exported)

    async def _run(self) -> None:
        # The first sample a quarter interval in, so a point shorter than the interval gets one.
        await asyncio.sleep(self._interval_s / 4)
        while not self._not_exported:
            await self._sample()
            await asyncio.sleep(self._interval_s)

    async def _sample(self) -> None:
        try:
            response = await self._client.get("/metrics", timeout=self._interval_s)
        except httpx.HTTPError:
            self._failed += 1
            return
        if response.status_code != 200:
            self._failed += 1
            return
        try:
            found = await asyncio.to_thread(read_gauge, response.text, self._names)
        except (ValueError, MissingPrometheusParser):  # a page that is no exposition
            self._failed += 1
            return
        if found is None:
            self._not_exported = True
            return
        self._gauge, value = found
        self._count += 1
        self._total += value
        self._peak = value if self._peak is None else max(self._peak, value)
