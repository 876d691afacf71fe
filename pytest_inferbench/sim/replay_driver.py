"""The agentic trace replay in process: the HTTP replay's schedule on the engine's virtual clock.

`loadgen/replay_schedule.py` says what is due; this hands each due request to the engine the
way the simulated server receives it from the HTTP replay -- the same prompt lengths
(`replay_prompts.prompt_tokens`), `max_tokens` = the recorded output (one token for a warmup
request, whose record is flagged `warmup`), and the prompt's block
keys equal where the server's content hashes of the same prompt text are
(`replay_prompts.prompt_block_keys`; a stream's turn reuses the keys of the prefix it shares
with the stream's previous turn, `PromptKeys`), so the prefix cache hits what it hits over
HTTP -- and tells the schedule when each finished, at the end of the engine step that emitted
its last token. Between events the engine runs stretches of identical decode steps in one go
(`stretch.advance`), so a long replay costs engine events, not tokens.

As in the fixed-length driver, a request the schedule makes due while a step runs joins the
step after it ends; one sent at a step's end (a completion released it) joins the step after
that, as on the server; an idle engine takes it at once. A request the engine can never run
(longer than its context) fails at once, as the server's HTTP 400, which ends its stream (a
context overflow, `replay_schedule`);
once more than a tenth of the requests answered so far failed so, the replay stops with
`RequestRejectedError`, as AIPerf cancels a run past its failed-request threshold (and on the
virtual clock a lane whose requests all fail would otherwise never see time pass); a root
stream's warmup request rejected so stops it at once, as AIPerf aborts the run (`replay_schedule`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..loadgen.replay_prompts import PromptKeys, prompt_tokens
from ..loadgen.replay_schedule import ReplaySchedule, is_context_overflow
from ..results.metrics import RequestRecord
from .driver import MAX_STRETCH, Finished, StepTimeline, finished_records, server_metrics
from .engine import Engine, RequestRejectedError
from .stretch import advance

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy.typing as npt

    from ..loadgen.replay_schedule import Dispatch, ReplayConfig, ReplayedRequest
    from ..loadgen.trace_sessions import SessionTree
    from ..results.record import JSONValue
    from .engine import Trace
    from .state import EngineCounters


# AIPerf's --failed-request-threshold (InferenceX keeps its default): past it the run is cancelled.
FAILED_REQUEST_THRESHOLD = 0.10


@dataclass(frozen=True)
class SimulatedReplay:
    records: Sequence[RequestRecord]  # in completion order
    requests: tuple[ReplayedRequest, ...]  # the same order
    duration_s: float  # from the start to the last completion (or the end, if later)
    profile_start: float  # when the warmup drained and the measured phase began
    plays: int
    plays_completed: int
    server_metrics: dict[str, JSONValue]
    # The engine's counters when profiling began, and its steps' total duration since: the
    # measured phase's work, which its power is priced from (`backends/sim.py`). A
    # deployment's replay (`cluster_replay.py`) has many engines and leaves them unset.
    profile_counters: EngineCounters | None = None
    profile_busy_s: float = 0.0


class _Run:
    """One replay's bookkeeping: what is in the engine, and what finished in which order."""

    def __init__(self, engine: Engine, schedule: ReplaySchedule, chat: bool) -> None:
        self.engine = engine
        self.schedule = schedule
        self.chat = chat
        self.sent: dict[int, tuple[Dispatch, float]] = {}
        self.done: list[tuple[int, float, Trace]] = []  # (position, send time, trace)
        self.lengths: list[tuple[int, int]] = []  # (prompt, output) tokens, finish order
        self.scheduled: list[float] = []
        self.requests: list[ReplayedRequest] = []
        self.rejected: dict[int, RequestRecord] = {}  # finish position -> its failed record
        self.keys = PromptKeys(engine.block_size, chat=chat)

    def admit(self, dispatch: Dispatch, now: float) -> None:
        turn, trace = dispatch.turn, dispatch.tree.trace
        r = turn.request
        engine = self.engine
        keys = (self.keys(turn, trace.block_size, dispatch.play,
                          last=dispatch.tree.streams[turn.session_id][-1] is turn)
                if engine.prefix_cache is not None else ())
        tokens = prompt_tokens(r.input_length, chat=self.chat)
        try:
            engine.add_request(dispatch.key, tokens, dispatch.output_tokens, block_hashes=keys)
        except RequestRejectedError as exc:
            reject(self.rejected, self.requests, self.schedule, dispatch, tokens, exc, now)
            return
        self.sent[dispatch.key] = (dispatch, dispatch.at)

    def finish(self, key: int, now: float) -> None:
        dispatch, send = self.sent.pop(key)
        r = dispatch.turn.request
        self.done.append((len(self.done), send, self.engine.pop_trace(key)))
        self.lengths.append((prompt_tokens(r.input_length, chat=self.chat),
                             dispatch.output_tokens))
        self.scheduled.append(scheduled_time(dispatch))
        self.requests.append(dispatch.described())
        self.schedule.complete(key, now)

    def records(self, ends: npt.NDArray[np.float64]) -> Sequence[RequestRecord]:
        lengths = np.asarray(self.lengths, np.int64).reshape(-1, 2)
        served = finished_records(Finished.of(self.done, self.engine.k > 0), ends,
                                  lengths[:, 0], lengths[:, 1],
                                  np.asarray(self.scheduled, np.float64))
        return replay_records(served, self.requests, self.rejected)


def reject(rejected: dict[int, RequestRecord], requests: list[ReplayedRequest],
           schedule: ReplaySchedule, dispatch: Dispatch, tokens: int,
           exc: RequestRejectedError, now: float) -> None:
    """A request the engine refused (a real server answers HTTP 400): its failed record at its
    place, the schedule told (a context overflow ends its session, a root stream's warmup
    request aborts the replay), and the replay stopped past AIPerf's failed-request threshold.
    This replay and a deployment's (`cluster_replay.py`) alike."""
    rejected[len(requests)] = RequestRecord(
        send_time=dispatch.at, end_time=now, input_tokens=tokens, output_tokens=0,
        success=False, error=f"HTTP 400: {exc}", scheduled_time=scheduled_time(dispatch))
    requests.append(dispatch.described())
    schedule.complete(dispatch.key, now, failed=True, overflow=is_context_overflow(str(exc)))
    if schedule.aborted is not None:
        raise RequestRejectedError(f"{schedule.aborted} ({exc})") from None
    if len(rejected) > FAILED_REQUEST_THRESHOLD * len(requests):
        raise RequestRejectedError(
            f"{len(rejected)} of the first {len(requests)} requests of the replay rejected "
            f"(more than {FAILED_REQUEST_THRESHOLD:.0%}), the last one: {exc}") from None


def replay_records(served: Sequence[RequestRecord], requests: Sequence[ReplayedRequest],
                   rejected: dict[int, RequestRecord]) -> Sequence[RequestRecord]:
    """A replay's records in its requests' order: the served ones, the engine's rejections at
    their places, warmup requests flagged (this replay and a deployment's alike)."""
    if not rejected and not any(q.warmup for q in requests):
        return served
    out: list[RequestRecord] = []
    it = iter(served)
    for pos, q in enumerate(requests):
        record = rejected[pos] if pos in rejected else next(it)
        out.append(replace(record, warmup=True) if q.warmup else record)
    return out


def scheduled_time(dispatch: Dispatch) -> float:
    """When the schedule wanted a request sent: its due time, or when it was taken."""
    return dispatch.due if dispatch.due is not None else dispatch.at


def simulate_replay(engine: Engine, trees: Sequence[SessionTree], concurrency: int,
                    settings: ReplayConfig, *, chat: bool) -> SimulatedReplay:
    """Replay `trees` at `concurrency` lanes for `settings.duration_s` virtual seconds on
    `engine` (idle, with traces kept) from virtual time 0 (module doc)."""
    engine.keep_traces = True
    engine.report_emitted = False  # the traces say it all
    schedule = ReplaySchedule(trees, concurrency, settings, 0.0)
    run = _Run(engine, schedule, chat)
    before = engine.counters()
    clock = StepTimeline()
    clock.n = engine.steps_done
    clock.ends = np.zeros(engine.steps_done + 4096)
    in_transit: list[Dispatch] = []
    profiled: tuple[EngineCounters, float] | None = None
    while True:
        if profiled is None and schedule.profile_start is not None:
            profiled = engine.counters(), clock.busy  # profiling began at this clock.now
        now = clock.now
        busy = engine.has_work()
        for dispatch in schedule.take(now):
            if busy and dispatch.at >= now:  # released by this step's end: the next step
                in_transit.append(dispatch)
            else:
                run.admit(dispatch, now)
        if not engine.has_work():
            if in_transit:  # an idle engine starts its next step when they arrive
                for dispatch in in_transit:
                    run.admit(dispatch, now)
                in_transit.clear()
                continue
            if schedule.finished(now):
                break
            due = schedule.next_due()
            clock.now = max(now, min(due, schedule.end) if due is not None else schedule.end)
            continue
        due = schedule.next_due()
        limit = due - now if due is not None and due < schedule.end else (
            schedule.end - now if now < schedule.end else math.inf)
        batch = advance(engine, 1 if in_transit else MAX_STRETCH, limit)
        clock.extend(batch.durations)
        for dispatch in in_transit:
            run.admit(dispatch, clock.now)
        in_transit.clear()
        for key in batch.finished:
            run.finish(key, clock.now)
    after = engine.counters()
    return SimulatedReplay(
        records=run.records(clock.ends), requests=tuple(run.requests), duration_s=clock.now,
        profile_start=clock.now if schedule.profile_start is None else schedule.profile_start,
        plays=schedule.plays, plays_completed=schedule.plays_completed,
        server_metrics=server_metrics(before, after, engine),
        profile_counters=after if profiled is None else profiled[0],
        profile_busy_s=0.0 if profiled is None else clock.busy - profiled[1])
