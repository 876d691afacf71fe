"""The measured phase of a point over HTTP, one bracket for the fixed-length load and the replay.

Around the load: a `/metrics` scrape where its measured phase begins (a fixed-length load's start,
a replay's end of warmup: `bracketed_phase`), the event-loop monitor, the collector's long-lived
objects frozen (shorter GC pauses while requests are timed), the server's KV usage sampled while
the measured phase runs, and after it a dead server turned into its error (`check_alive`) before a
second scrape. What the two scrapes and the samples say becomes the point's server metrics; a
simulated server's energy counters in them, the point's power.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from ..loadgen.affinity import is_local
from ..loadgen.scrape import MissingPrometheusParser, Snapshot, point_metrics, scrape
from ..loadgen.selfcheck import LoopMonitor
from ..loadgen.server_sampler import GaugeSampler
from ..results.power import SIMULATED_SOURCE, PowerReading
from ..sim.power import ENERGY_COUNTER, SECONDS_COUNTER
from .gpu_power import (
    NO_TOOL_REASON,
    NOT_LOCAL_REASON,
    GpuPowerMonitor,
    discard,
    power_reading,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import httpx

    from ..loadgen.selfcheck import LoopStats
    from ..results.metrics import RequestRecord
    from ..results.record import JSONValue


class Run(Protocol):
    """What the bracket reads of a load's outcome (`client.LoadRun`, `replay.ReplayRun`)."""

    @property
    def records(self) -> Sequence[RequestRecord]: ...
    @property
    def start(self) -> float: ...  # perf_counter of the first send
    @property
    def end(self) -> float: ...  # perf_counter of the last response's end
    @property
    def duration_s(self) -> float: ...  # the measured phase's: it ends at `end`


class Server(Protocol):
    simulated: bool
    base_url: str
    time_scale: float | None

    def check_alive(self) -> None: ...


R = TypeVar("R", bound=Run)
Begin = Callable[[], Awaitable[None]]  # the load's call where its measured phase starts
NEVER_BEGAN = "the load stopped before its measured phase began"


@dataclass(frozen=True)
class Phase(Generic[R]):
    run: R
    loop: LoopStats
    server_metrics: dict[str, JSONValue]
    started_unix: float  # the first send, wall time
    power: PowerReading


async def scrape_noting(client: httpx.AsyncClient, simulated: bool,
                        notes: list[str]) -> Snapshot:
    """A scrape whose missing parser becomes a note of the point, not its failure."""
    try:
        return await scrape(client, simulated=simulated)
    except MissingPrometheusParser as exc:
        notes.append(str(exc))
        return Snapshot(error=str(exc))


SIMULATED = "a simulated server: its power is its model's (/metrics)"
NO_ENERGY_COUNTER = ("the simulated server exports no energy counter (its power model covers "
                     "single-node servers of GPUs with power figures)")


def power_monitor(server: Server) -> GpuPowerMonitor | str:
    """A GPU power sampler for the measured phase, or why there is none."""
    if server.simulated:
        return SIMULATED
    if not is_local(server.base_url):
        return NOT_LOCAL_REASON
    return GpuPowerMonitor.start() or NO_TOOL_REASON


def wall_clock_power_note(time_scale: float) -> str:
    return (f"time scale {time_scale:g}: the simulated power is per wall-clock second, as the "
            f"point's durations and throughputs are (the model's watts / {time_scale:g}); its "
            "energy and energy per token are the model's")


def simulated_power(server_metrics: Mapping[str, JSONValue], gpus: int,
                    time_scale: float | None) -> PowerReading:
    """Each GPU's mean power over the phase by a simulated server's own power model: the
    differences of its energy and model-clock counters between the two scrapes. The record's
    durations are wall-clock seconds (the client's, never rescaled), and the server's clock
    runs `time_scale` wall seconds per model second: the power is per wall second, so that
    mean power x GPUs x the record's duration is the energy the counters priced."""
    if time_scale == 0:
        return PowerReading.missing(SIMULATED_SOURCE, "time scale 0: the simulated server "
                                    "keeps no clock, so its points' durations price no energy")
    deltas = server_metrics.get("counter_deltas")
    joules = deltas.get(f"{ENERGY_COUNTER}_total") if isinstance(deltas, dict) else None
    seconds = deltas.get(f"{SECONDS_COUNTER}_total") if isinstance(deltas, dict) else None
    if not isinstance(joules, (int, float)) or not isinstance(seconds, (int, float)):
        error = server_metrics.get("scrape_error")
        return PowerReading.missing(SIMULATED_SOURCE, f"/metrics not read: {error}" if error
                                    else NO_ENERGY_COUNTER)
    if seconds <= 0:
        return PowerReading.missing(SIMULATED_SOURCE, "no simulated time passed in the phase")
    wall_s = seconds * (1.0 if time_scale is None else time_scale)
    return PowerReading(SIMULATED_SOURCE, avg_power_w=joules / wall_s, num_gpus=gpus)


async def measured_phase(server: Server, client: httpx.AsyncClient, notes: list[str],
                         load: Callable[[], Awaitable[R]], gpus: int) -> Phase[R]:
    """Run `load()` inside the bracket, its measured phase the whole load; `client` is the
    scrape client, not the load's pool; `gpus`: the server's, which a simulated server's power
    counts."""
    async def whole(begin: Begin) -> R:
        await begin()
        return await load()

    return await bracketed_phase(server, client, notes, whole, gpus)


async def bracketed_phase(server: Server, client: httpx.AsyncClient, notes: list[str],
                          load: Callable[[Begin], Awaitable[R]], gpus: int) -> Phase[R]:
    """Run `load(begin)` inside the bracket: the load awaits `begin()` where its measured phase
    starts (a replay: once its warmup drained, nothing in flight), which takes the "before"
    scrape and starts sampling the KV usage; a load that never calls it measured nothing."""
    opened: list[tuple[Snapshot, GaugeSampler | None]] = []

    async def begin() -> None:
        if opened:
            return
        before = await scrape_noting(client, server.simulated, notes)
        # A server without /metrics has no gauge to sample either.
        sampler = GaugeSampler(client) if not before.error else None
        if sampler is not None:
            sampler.start()
        opened.append((before, sampler))

    monitor = LoopMonitor()
    gc.collect()
    gc.freeze()  # long-lived objects out of the collector's way: shorter GC pauses
    power = power_monitor(server)  # sampling before the load starts: its window is covered
    try:
        monitor.start()
        try:
            run = await load(begin)
        finally:
            sampler = opened[0][1] if opened else None
            kv = await sampler.stop() if sampler is not None else None
        ran_at = time.time(), time.perf_counter()
        stats = await monitor.stop()
    except BaseException:
        discard(power)
        raise
    finally:
        gc.unfreeze()
    # time.time() and time.perf_counter() read together right after the load: the one way
    # from the load's perf_counter stamps to wall time.
    started_unix = ran_at[0] - (ran_at[1] - run.start)
    measured_unix = ran_at[0] - (ran_at[1] - (run.end - run.duration_s))
    watts = power_reading(power, measured_unix, measured_unix + run.duration_s)
    if any(not r.success for r in run.records):
        server.check_alive()
    before = opened[0][0] if opened else Snapshot(error=NEVER_BEGAN)
    if before.error:
        metrics: dict[str, JSONValue] = {"scrape_error": before.error}
    else:
        after = await scrape_noting(client, server.simulated, notes)
        sampled = kv.describe("kv_cache_usage") if kv is not None else None
        metrics = point_metrics(before, after, sampled)
    if server.simulated:
        watts = simulated_power(metrics, gpus, server.time_scale)
        if watts.valid and server.time_scale not in (None, 1.0):
            notes.append(wall_clock_power_note(server.time_scale))
    return Phase(run, stats, metrics, started_unix, watts)
