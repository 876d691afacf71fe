"""`run_point` of an agentic-coding point over HTTP: the trace replay (`loadgen/replay.py`).

The traces and the result's description of the replay are `agentic_traces`'s. Like the
fixed-length load: the measured phase's bracket (`measured.py`: scrapes, event-loop monitor, KV
usage and GPU power sampled during the replay), the client self-check, one `RequestRecord` per
request. The replay's warmup (agentic.md §3.3: each lane's first tree from its seeded t*, its
primers and per-lane warmup requests) runs inside the bracket; its records are flagged `warmup`
and measured by no metric. The "before" scrape is taken once the warmup drained, before the
first profiling request leaves, so the server's counters (its tokens, a simulated server's
energy) cover the profiling phase the duration and the records' token counts cover.

A request that lost the server stops the replay (`loadgen/replay.py`); the point fails naming
it (`results.build.measurement_failures`), and where the server is found dead its log tail
follows that line (`ServerDiedError`). A root stream's warmup request that fails aborts the
replay before profiling, as AIPerf does, and the point is not measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Protocol

from ..loadgen.affinity import pinned_to_one_cpu
from ..loadgen.replay import replay
from ..loadgen.replay_config import replay_config
from ..loadgen.selfcheck import point_verdict
from ..results.measurement import SIMULATED_NOTE, PointMeasurement
from .agentic_traces import replay_meta, replay_note, replay_traces, replay_workload
from .base import PointNotMeasuredError, ServerDiedError
from .measured import Begin, bracketed_phase

if TYPE_CHECKING:
    from ..loadgen.client import ClientConfig
    from ..loadgen.prompts import TextTokenizer
    from ..loadgen.replay import ReplayRun
    from ..loadgen.replay_config import ReplayConfig
    from ..loadgen.trace_sessions import SessionTree
    from ..loadgen.workload import LoadSettings
    from ..recipe.model import BenchPoint


class HttpServerHandle(Protocol):
    """What the replay reads of its server's handle (`http.HttpServerHandle`)."""

    simulated: bool
    base_url: str
    time_scale: float | None

    def server_group(self) -> int | None: ...
    def tokenizer(self) -> TextTokenizer | None: ...
    def client_config(self, conc: int, tokenizer: TextTokenizer | None,
                      stall_timeout_s: float = ..., point_timeout_s: float | None = ...
                      ) -> ClientConfig: ...
    def check_alive(self) -> None: ...


def run_replay_point(handle: HttpServerHandle, point: BenchPoint, load: LoadSettings
                     ) -> PointMeasurement:
    label, trees = replay_traces(load.traces)
    cfg = handle.client_config(point.conc, handle.tokenizer(), load.stall_timeout_s,
                               load.point_timeout_s)
    # A simulated server's clock scales the recorded gaps with it (0: no waiting at all).
    scale = handle.time_scale if handle.simulated and handle.time_scale is not None else 1.0
    settings = replay_config(load, delay_scale=scale)
    with pinned_to_one_cpu(handle.server_group()) as pinning:
        measurement = asyncio.run(_measure(handle, point, cfg, trees, settings, label))
    check = {**measurement.client_check, "client_cpu_pinned": pinning.cpu,
             "client_cpu_choice": pinning.choice}
    return dataclasses.replace(measurement, client_check=check)


async def _measure(handle: HttpServerHandle, point: BenchPoint, cfg: ClientConfig,
                   trees: tuple[SessionTree, ...], settings: ReplayConfig, label: str
                   ) -> PointMeasurement:
    from ..loadgen.connections import make_http_client

    notes = [replay_note(label, settings, point.conc)]
    if handle.simulated:
        notes.append(SIMULATED_NOTE)
    ran: list[ReplayRun] = []

    async def load(begin: Begin) -> ReplayRun:
        ran.append(await replay(cfg, trees, point.conc, settings, on_profile=begin))
        return ran[0]

    async with make_http_client(cfg, 1) as client:
        try:
            phase = await bracketed_phase(handle, client, notes, load, point.server.gpus)
        except ServerDiedError as exc:
            if ran and ran[0].fault:  # the request that found it gone, then its log
                raise ServerDiedError(f"{ran[0].fault}\n{exc}") from None
            raise
    run, stats, server = phase.run, phase.loop, phase.server_metrics
    if run.aborted:  # AIPerf exits before profiling: nothing was measured
        raise PointNotMeasuredError(f"{point.name}: {run.aborted}")
    check = point_verdict(stats, run.records, time_scale=handle.time_scale)
    described = replay_workload(label, trees, point.conc, settings, run.requests, run.plays,
                                run.plays_completed, cfg.text_token_source)
    replayed = replay_meta(point.server.gpus, settings, run.requests, clock_start=run.start,
                           start_unix=phase.started_unix, cancelled=run.cancelled,
                           fault=run.fault)
    return PointMeasurement(
        records=run.records, duration_s=run.duration_s, num_prompts=len(run.records),
        max_concurrency=point.conc, simulated=handle.simulated, server_metrics=server,
        client_check=check, notes=tuple(notes), started_unix=phase.started_unix,
        workload=described, time_scale=handle.time_scale, power=phase.power, replay=replayed)
