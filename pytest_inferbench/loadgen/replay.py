"""The agentic trace replay over HTTP: the schedule of `replay_schedule.py` on the wall clock.

The schedule says what is due (lanes of session trees, end-to-start gaps, spawn/join, both idle
caps, the duration cut; agentic.md §3); this sends each request the moment it is due, every turn
re-sending its whole prompt (`replay_prompts.py`) with `max_tokens` = the recorded output length
(one token for a warmup request, whose record is flagged `warmup`) and `ignore_eos`, and tells
the schedule when each one ended.

Timestamps and records are the fixed-length client's (`client.py`): `send_raw` stamps arrivals,
one `RequestRecord` per request, parsed off the dispatch path.

A request that loses its server -- a stream silent past the stall timeout (a hung engine, a
stopped process) or a connection refused or cut (a crashed one) -- stops the replay at once:
every later request would wait out the same stall or fail the same way until the duration
ends. The other lanes' requests in flight are cancelled (recorded, with what they received),
nothing more is sent, and the run says why (`ReplayRun.fault`: the request, its lane, the
cause). An answer, even an HTTP error, goes on as §3.4 "Errors" says -- except on a root
stream's warmup request, which the schedule turns into an abort (`ReplayRun.aborted`), stopping
the replay the same way before profiling.

`on_profile` (the point's "before" scrape) is awaited once the warmup drained, nothing in flight;
the profiling phase (its timers, its duration) starts when it returned, so it delays no request.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .client import (
    DEADLINE,
    STALLED,
    ClientConfig,
    RawResponse,
    _RecordBuilder,
    send_raw,
    server_lost,
)
from .connections import make_http_client
from .prompts import Prompt
from .replay_prompts import BlockText, marker, prompt_text, prompt_tokens
from .replay_schedule import (
    Dispatch,
    ReplayConfig,
    ReplayedRequest,
    ReplaySchedule,
    is_context_overflow,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    import httpx

    from ..results.metrics import RequestRecord
    from .trace_sessions import SessionTree

__all__ = ["ReplayConfig", "ReplayRun", "ReplayedRequest", "Replayer", "replay"]


@dataclass(frozen=True)
class ReplayRun:
    records: tuple[RequestRecord, ...]  # in completion order, warmup ones flagged
    requests: tuple[ReplayedRequest, ...]  # the same order
    start: float
    end: float
    profile_start: float  # when the warmup drained and the measured phase began
    plays: int  # trees started
    plays_completed: int  # trees whose every stream sent every turn
    cancelled: bool = False  # the point's deadline cut the replay off
    fault: str = ""  # why the replay stopped before its end: a request lost the server
    aborted: str = ""  # why the warmup failed and the replay stopped before profiling

    @property
    def duration_s(self) -> float:
        """The measured phase's: from the end of the warmup to the end."""
        return self.end - self.profile_start


class Replayer:
    """One replay of `trees` at `concurrency` lanes against the server of `cfg`."""

    def __init__(self, cfg: ClientConfig, trees: Sequence[SessionTree], concurrency: int,
                 replay: ReplayConfig, on_record: Callable[[RequestRecord], None] | None = None,
                 on_read: Callable[[], None] | None = None,
                 on_profile: Callable[[], Awaitable[None]] | None = None) -> None:
        if not trees:
            raise ValueError("no traces to replay")
        self.cfg = cfg
        self.trees = trees
        self.concurrency = concurrency
        self.replay = replay
        self.run_id = replay.run_id or uuid.uuid4().hex
        self.on_read = on_read
        self.on_profile = on_profile
        self.records: list[RequestRecord | None] = []
        self.requests: list[ReplayedRequest] = []
        self.builder = _RecordBuilder(cfg, self.records, on_record)
        self.free: list[httpx.AsyncClient] = []
        self.clients: list[httpx.AsyncClient] = []
        self.texts: dict[str, BlockText] = {}  # one per trace: its blocks' words drawn once
        # Set when the replay is cut off (the point's deadline, a fault): a request cancelled
        # then keeps what it received (`send_raw`).
        self.stopped = asyncio.Event()
        self.deadline_passed = False
        self.fault = ""  # the request that lost the server, and how
        self.fault_at = ""  # what stopped the replay, for the requests it cancelled
        self.aborted = ""
        self.cancelled_in_flight = 0
        self.wake = asyncio.Event()  # a request completed: the schedule may have more due
        self.start = 0.0
        self.failed: list[asyncio.Task[None]] = []
        self.sends: set[asyncio.Task[None]] = set()
        self.main: asyncio.Future[None] | None = None

    async def run(self) -> ReplayRun:
        self.start = time.perf_counter()
        schedule = ReplaySchedule(self.trees, self.concurrency, self.replay, self.start,
                                  hold_profile=self.on_profile is not None)
        main = self.main = asyncio.ensure_future(self._dispatch(schedule, self.sends))

        def expire() -> None:
            self.deadline_passed = True
            self._stop()

        deadline = self.cfg.point_deadline_s
        timer = (asyncio.get_running_loop().call_later(deadline, expire)
                 if deadline is not None else None)
        try:
            await main
        except asyncio.CancelledError:
            if not self.stopped.is_set():
                raise
            await asyncio.gather(*self.sends, return_exceptions=True)
        finally:
            if timer is not None:
                timer.cancel()
            ended = time.perf_counter()
            await asyncio.gather(*(c.aclose() for c in self.clients), return_exceptions=True)
        await self.builder.finish()
        fault = self.fault and (
            f"{self.fault}; the replay stopped {ended - self.start:.1f} s in, "
            f"{self.cancelled_in_flight} other request(s) in flight cancelled")
        pairs = [(r, q) for r, q in zip(self.records, self.requests, strict=True)
                 if r is not None]
        records = tuple(replace(r, warmup=True) if q.warmup else r for r, q in pairs)
        profile_start = schedule.profile_start
        return ReplayRun(records=records, requests=tuple(q for _, q in pairs), start=self.start,
                         end=ended, profile_start=ended if profile_start is None
                         else profile_start,
                         plays=schedule.plays, plays_completed=schedule.plays_completed,
                         cancelled=self.deadline_passed, fault=fault, aborted=self.aborted)

    def _stop(self) -> None:
        """Send nothing more and cancel every request in flight but the caller's own."""
        self.stopped.set()
        if self.main is not None:
            self.main.cancel()
        current = asyncio.current_task()
        for task in self.sends:
            if task is not current:
                task.cancel()

    async def _dispatch(self, schedule: ReplaySchedule, sends: set[asyncio.Task[None]]) -> None:
        """Send what is due, sleep until the next timer or completion, until the schedule ends."""
        while True:
            self.wake.clear()
            if schedule.held and self.on_profile is not None:
                # The warmup drained and nothing is in flight: `on_profile` runs before the
                # first profiling request is due, and the phase (its timers, its duration)
                # starts once it returned, so its time delays no request.
                await self.on_profile()
                schedule.begin_profile(time.perf_counter())
            now = time.perf_counter()
            for dispatch in schedule.take(now):
                task = asyncio.ensure_future(self._send(schedule, dispatch))
                sends.add(task)
                task.add_done_callback(sends.discard)
                task.add_done_callback(self._sent)
            for task in self.failed:  # a bug, not a failed request (`send_raw` never raises)
                raise task.exception() or RuntimeError("a replay request failed")
            if schedule.finished(now):
                return
            due = schedule.next_due()
            wait = None if due is None else max(0.0, min(due, schedule.end) - now)
            if wait is None and not schedule.total_in_flight and math.isfinite(schedule.end):
                wait = max(0.0, schedule.end - now)  # nothing to wait for but the end
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), wait)

    def _sent(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.failed.append(task)
            self.wake.set()

    async def _send(self, schedule: ReplaySchedule, dispatch: Dispatch) -> None:
        turn, trace = dispatch.turn, dispatch.tree.trace
        text = self.texts.get(trace.id)
        if text is None:
            text = self.texts[trace.id] = BlockText(trace.id, trace.block_size, self.replay.seed)
        rid = marker(self.run_id, dispatch.play, dispatch.lane, trace.id)
        r = turn.request
        prompt = Prompt(text=prompt_text(text.stream(turn), rid, chat=self.cfg.chat),
                        input_tokens=prompt_tokens(r.input_length, chat=self.cfg.chat),
                        output_tokens=dispatch.output_tokens)
        client = self.free.pop() if self.free else self._client()
        try:
            raw = await send_raw(client, self.cfg, prompt, scheduled=dispatch.due,
                                 on_read=self.on_read, expired=self.stopped)
        finally:
            self.free.append(client)
        if self.stopped.is_set() and not self.deadline_passed and raw.error == DEADLINE:
            # Cut off by another request's fault, not by the deadline `send_raw` assumed.
            self.cancelled_in_flight += 1
            raw = replace(raw, error=f"cancelled: the replay stopped ({self.fault_at})")
        elif not self.stopped.is_set() and server_lost(raw.error):
            self.fault_at = f"a request on lane {dispatch.lane} lost the server"
            self.fault = self._fault(dispatch, raw)
            self._stop()
        schedule.complete(dispatch.key, raw.ended, failed=bool(raw.error),
                          overflow=bool(raw.error) and is_context_overflow(raw.error))
        if schedule.aborted is not None and not self.stopped.is_set():
            self.fault_at = f"a root stream's warmup request on lane {dispatch.lane} failed"
            self.aborted = f"{schedule.aborted} ({raw.error})"
            self._stop()
        self.wake.set()
        self.requests.append(dispatch.described())
        self.records.append(None)
        self.builder.queue.put_nowait((len(self.records) - 1, raw))

    def _fault(self, dispatch: Dispatch, raw: RawResponse) -> str:
        where = (f"request {dispatch.turn.session_id} turn {dispatch.turn.index} (play "
                 f"{dispatch.play}) on lane {dispatch.lane}, sent {raw.sent - self.start:.1f} s "
                 "in")
        if raw.error == STALLED:
            return (f"{where}, stalled: no data for {self.cfg.timeouts.read_s:g} s "
                    "(--inferbench-stall-timeout)")
        return f"{where}, lost the server: {raw.error}"

    def _client(self) -> httpx.AsyncClient:
        # One single-connection client per request in flight: a lane's subagents run at once.
        client = make_http_client(self.cfg, 1)
        self.clients.append(client)
        return client


async def replay(cfg: ClientConfig, trees: Sequence[SessionTree], concurrency: int,
                 settings: ReplayConfig, *,
                 on_record: Callable[[RequestRecord], None] | None = None,
                 on_read: Callable[[], None] | None = None,
                 on_profile: Callable[[], Awaitable[None]] | None = None) -> ReplayRun:
    """Replay `trees` at `concurrency` lanes until `settings.duration_s` (module doc);
    `on_profile`: awaited when the warmup has drained, before profiling begins."""
    return await Replayer(cfg, trees, concurrency, settings, on_record, on_read,
                          on_profile).run()
