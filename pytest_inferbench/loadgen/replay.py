"""The agentic trace replay over HTTP: lanes of live session trees (agentic.md §3).

`--concurrency N` is N lanes (§3.2); each lane plays one trace's session tree at a time -- the
root stream and its subagents, which run concurrently inside the lane -- and when the whole tree
has drained it recycles to the next trace in dataset order, wrapping, from turn 0 with a fresh
cache-bust marker (§3.2, §3.4 "Session end"). Within a stream the next turn is sent when the
previous one completed plus the recorded end-to-start gap (§2.3 "Timing per turn", §3.4
"Dispatch rule"); a root turn that joins subagents also waits for them; a subagent starts when
its spawning root turn completes, plus its offset within its branch (`max(0, t0 - branch
start)`). Every turn re-sends its whole prompt (`replay_prompts.py`) with `max_tokens` = the
recorded output length and `ignore_eos`.

Both idle caps of §3.4 move timers and never reorder requests: once a tree has nothing in flight
its earliest pending timer is pulled to at most `trace_idle_cap_s` after it went idle (its other
timers shift by as much), and once nothing anywhere is in flight every timer shifts so the next
fires at most `system_idle_cap_s` after the system went idle. After `duration_s` no request is
sent; those in flight finish and count (§3.4 "End of profiling").

Not yet done (this is the first increment): the startup at a seeded t* with primers and per-lane
warmup requests (§3.3), the nested chain splitting of subagents (§2.3), and ending a session on
a context-overflow error (§3.4 "Errors"); every lane starts its first trace at turn 0.

Timestamps and records are the fixed-length client's (`client.py`): `send_raw` stamps arrivals,
one `RequestRecord` per request, parsed off the dispatch path.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .client import ClientConfig, RawResponse, _RecordBuilder, make_http_client, send_raw
from .prompts import Prompt
from .replay_prompts import BlockText, marker, prompt_text, prompt_tokens
from .workload import DEFAULT_REPLAY_DURATION_S

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Sequence

    import httpx

    from ..results.metrics import RequestRecord
    from .trace_sessions import SessionTree, Turn

# InferenceX's idle caps (§3.1 scenario locks and flags, §3.4).
SYSTEM_IDLE_CAP_S = 10.0
TRACE_IDLE_CAP_S = 300.0


@dataclass(frozen=True)
class ReplayConfig:
    duration_s: float = DEFAULT_REPLAY_DURATION_S  # no request is sent after it
    system_idle_cap_s: float = SYSTEM_IDLE_CAP_S
    trace_idle_cap_s: float = TRACE_IDLE_CAP_S
    delay_scale: float = 1.0  # recorded end-to-start gaps are multiplied by it (1: as recorded)
    seed: int = 0  # of the block texts
    run_id: str = ""  # the markers' key space; "" draws a fresh one, so runs never share cache


@dataclass(frozen=True)
class ReplayedRequest:
    """What one record of a replay was: which lane, play, stream and turn, and its timing."""

    lane: int
    play: int
    trace_id: str
    session_id: str
    turn: int
    input_length: int  # recorded `in`
    output_length: int  # recorded `out` = max_tokens
    hit_blocks: int  # theoretical prefix hit, trace blocks (`trace_sessions.Turn`)
    total_blocks: int
    block_size: int
    delay_s: float | None  # the recorded end-to-start gap after the stream's previous turn
    previous_end: float | None  # when the stream's previous turn ended (perf_counter)


@dataclass(frozen=True)
class ReplayRun:
    records: tuple[RequestRecord, ...]  # in completion order
    requests: tuple[ReplayedRequest, ...]  # the same order
    start: float
    end: float
    plays: int  # trees started
    plays_completed: int  # trees whose every stream sent every turn
    cancelled: bool = False  # the point's deadline cut the replay off

    @property
    def duration_s(self) -> float:
        return self.end - self.start


class _Timers:
    """Pending dispatch timers of every tree and the two idle caps that move them (§3.4).

    Timers are kept per tree, so a request's end touches its own tree's timers only; the system
    cap, reached when nothing at all is in flight, moves every timer.
    """

    def __init__(self, cfg: ReplayConfig, end: float) -> None:
        self.cfg = cfg
        self.end = end
        self.timers: dict[int, dict[int, list[float]]] = {}  # tree -> timer id -> [due]
        self.in_flight: dict[int, int] = {}
        self.total = 0
        self.idle_since: dict[int, float] = {}  # trees with nothing in flight
        self.system_idle_since: float | None = None
        self.changed: dict[int, asyncio.Event] = {}  # set when a tree's timers moved
        self._next = 0

    def begin(self, tree: int) -> None:
        self.in_flight[tree] = self.in_flight.get(tree, 0) + 1
        self.total += 1
        self.idle_since.pop(tree, None)
        self.system_idle_since = None

    def finish(self, tree: int) -> None:
        now = time.perf_counter()
        self.in_flight[tree] -= 1
        self.total -= 1
        if not self.in_flight[tree]:
            self.idle_since[tree] = now
        if not self.total:
            self.system_idle_since = now
        self._cap(tree)

    def forget(self, tree: int) -> None:
        self.in_flight.pop(tree, None)
        self.idle_since.pop(tree, None)
        self.timers.pop(tree, None)
        self.changed.pop(tree, None)

    def _shift(self, tree: int, shift: float) -> None:
        for timer in self.timers[tree].values():
            timer[0] -= shift
        event = self.changed.pop(tree, None)
        if event is not None:  # its sleepers wake and read their new due times
            event.set()

    def _cap(self, tree: int) -> None:
        own = self.timers.get(tree)
        since = self.idle_since.get(tree)
        if own and since is not None:
            shift = min(t[0] for t in own.values()) - (since + self.cfg.trace_idle_cap_s)
            if shift > 0:
                self._shift(tree, shift)
        if not self.total:
            dues = [t[0] for timers in self.timers.values() for t in timers.values()]
            since = self.system_idle_since or time.perf_counter()
            if dues and (shift := min(dues) - (since + self.cfg.system_idle_cap_s)) > 0:
                for other in list(self.timers):
                    self._shift(other, shift)

    async def sleep_until(self, tree: int, due: float) -> bool:
        """Wait for the timer (as the caps move it); False when the run's end came first."""
        key = self._next
        self._next += 1
        timer = self.timers.setdefault(tree, {})[key] = [due]
        if not self.in_flight.get(tree):
            self.idle_since.setdefault(tree, time.perf_counter())
        self._cap(tree)
        try:
            while True:
                now = time.perf_counter()
                if timer[0] <= now:
                    return True
                if now >= self.end:
                    return False
                changed = self.changed.setdefault(tree, asyncio.Event())
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(timer[0], self.end) - now)
        finally:
            del self.timers[tree][key]


class Replayer:
    """One replay of `trees` at `concurrency` lanes against the server of `cfg`."""

    def __init__(self, cfg: ClientConfig, trees: Sequence[SessionTree], concurrency: int,
                 replay: ReplayConfig, on_record: Callable[[RequestRecord], None] | None = None,
                 on_read: Callable[[], None] | None = None) -> None:
        if not trees:
            raise ValueError("no traces to replay")
        self.cfg = cfg
        self.trees = trees
        self.concurrency = concurrency
        self.replay = replay
        self.run_id = replay.run_id or uuid.uuid4().hex
        self.on_read = on_read
        self.records: list[RequestRecord | None] = []
        self.requests: list[ReplayedRequest] = []
        self.builder = _RecordBuilder(cfg, self.records, on_record)
        self.free: list[httpx.AsyncClient] = []
        self.clients: list[httpx.AsyncClient] = []
        self.plays = 0
        self.completed = 0
        self.expired = asyncio.Event()
        self.start = self.end = 0.0
        self.timers = _Timers(replay, 0.0)

    async def run(self) -> ReplayRun:
        self.start = time.perf_counter()
        self.end = self.start + self.replay.duration_s
        self.timers = _Timers(self.replay, self.end)
        lanes = [asyncio.ensure_future(self._lane(i)) for i in range(self.concurrency)]

        def expire() -> None:
            self.expired.set()
            for task in lanes:
                task.cancel()

        deadline = self.cfg.point_deadline_s
        timer = (asyncio.get_running_loop().call_later(deadline, expire)
                 if deadline is not None else None)
        try:
            await asyncio.gather(*lanes, return_exceptions=self.expired.is_set())
        except asyncio.CancelledError:
            if not self.expired.is_set():
                raise
        finally:
            if timer is not None:
                timer.cancel()
            ended = time.perf_counter()
            await asyncio.gather(*(c.aclose() for c in self.clients), return_exceptions=True)
        await self.builder.finish()
        return ReplayRun(records=tuple(r for r in self.records if r is not None),
                         requests=tuple(self.requests), start=self.start, end=ended,
                         plays=self.plays, plays_completed=self.completed,
                         cancelled=self.expired.is_set())

    def _open(self) -> bool:
        return time.perf_counter() < self.end and not self.expired.is_set()

    async def _lane(self, lane: int) -> None:
        while self._open():
            play = self.plays
            self.plays += 1
            # Dataset order, wrapping: the first lanes take the first traces (§3.2).
            if await self._play(lane, play, self.trees[play % len(self.trees)]):
                self.completed += 1

    async def _play(self, lane: int, play: int, tree: SessionTree) -> bool:
        trace = tree.trace
        text = BlockText(trace.id, trace.block_size, self.replay.seed)
        rid = marker(self.run_id, play, lane, trace.id)
        children: dict[str, asyncio.Task[bool]] = {}

        async def stream(session: str, first_due: float | None) -> bool:
            turns = tree.streams.get(session, ())
            previous_end: float | None = None
            for turn in turns:
                if session == trace.id:  # a joining root turn waits for its subagents
                    joined = [children[link.session_id] for link in tree.links
                              if link.join_turn == turn.index and link.session_id in children]
                    if joined:
                        await asyncio.gather(*joined)
                due = first_due if previous_end is None else (
                    previous_end + (turn.delay or 0.0) * self.replay.delay_scale)
                if due is not None and due > time.perf_counter() and not \
                        await self.timers.sleep_until(play, due):
                    return False
                if not self._open():
                    return False
                raw = await self._send(lane, play, turn, rid, text, due, previous_end)
                previous_end = raw.ended
                if session == trace.id:
                    self._spawn(tree, turn.index, raw.ended, stream, children)
            return True

        root_done = await stream(trace.id, None)
        # The lane drains the whole tree, background subagents too (§3.2); only the root
        # spawns, and it is done.
        await asyncio.gather(*children.values())
        self.timers.forget(play)
        return root_done and all(t.result() for t in children.values()) and len(children) == len(
            tree.links)

    def _spawn(self, tree: SessionTree, turn: int, ended: float,
               stream: Callable[[str, float | None], Coroutine[object, object, bool]],
               children: dict[str, asyncio.Task[bool]]) -> None:
        """Start the subagents the root turn `turn` spawns (a branch: same spawn and join)."""
        spawned = [link for link in tree.links if link.spawn_turn == turn]
        for link in spawned:
            branch = [b for b in spawned if b.join_turn == link.join_turn]
            starts = [tree.streams[b.session_id][0].request.t for b in branch
                      if tree.streams.get(b.session_id)]
            own = tree.streams.get(link.session_id)
            offset = max(0.0, own[0].request.t - min(starts)) if own and starts else 0.0
            coro = stream(link.session_id, ended + offset * self.replay.delay_scale)
            children[link.session_id] = asyncio.ensure_future(coro)

    async def _send(self, lane: int, play: int, turn: Turn, rid: str, text: BlockText,
                    due: float | None, previous_end: float | None) -> RawResponse:
        r = turn.request
        prompt = Prompt(text=prompt_text(text.stream(turn), rid, chat=self.cfg.chat),
                        input_tokens=prompt_tokens(r.input_length, chat=self.cfg.chat),
                        output_tokens=max(1, r.output_length))
        client = self.free.pop() if self.free else self._client()
        self.timers.begin(play)
        try:
            raw = await send_raw(client, self.cfg, prompt, scheduled=due, on_read=self.on_read,
                                 expired=self.expired)
        finally:
            self.timers.finish(play)
            self.free.append(client)
        self.requests.append(ReplayedRequest(
            lane=lane, play=play, trace_id=text.trace_id, session_id=turn.session_id,
            turn=turn.index, input_length=r.input_length, output_length=r.output_length,
            hit_blocks=turn.hit_blocks, total_blocks=turn.total_blocks,
            block_size=text.block_size, delay_s=turn.delay, previous_end=previous_end))
        self.records.append(None)
        self.builder.queue.put_nowait((len(self.records) - 1, raw))
        return raw

    def _client(self) -> httpx.AsyncClient:
        # One single-connection client per request in flight: a lane's subagents run at once.
        client = make_http_client(self.cfg, 1)
        self.clients.append(client)
        return client


async def replay(cfg: ClientConfig, trees: Sequence[SessionTree], concurrency: int,
                 settings: ReplayConfig, *,
                 on_record: Callable[[RequestRecord], None] | None = None,
                 on_read: Callable[[], None] | None = None) -> ReplayRun:
    """Replay `trees` at `concurrency` lanes until `settings.duration_s` (module doc)."""
    return await Replayer(cfg, trees, concurrency, settings, on_record, on_read).run()
