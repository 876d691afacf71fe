"""The agentic replay's schedule: what to send and when, told only when each request completed.

One schedule serves both replays: the HTTP one on the wall clock (`replay.py`) and the
simulator's in process on its virtual clock (`sim/replay_driver.py`), so both send the same
requests in the same order under the same rules (agentic.md §3). It reads no clock and does
no I/O: the caller says "request k completed at t" (`complete`) and asks what is due by now
(`take`) and when the next timer fires (`next_due`).

`concurrency` lanes (§3.2) each play one trace's session tree at a time -- the root stream and
its subagents, which run concurrently inside the lane -- and when the whole tree has drained the
lane recycles to the next trace in dataset order, wrapping, from turn 0 under a fresh play
number (its cache-bust marker, §3.4 "Session end"). Within a stream the next turn is due when
the previous one completed plus the recorded end-to-start gap times `delay_scale` (§2.3
"Timing per turn", §3.4 "Dispatch rule"); a root turn that joins subagents also waits for them;
a subagent is due when its spawning root turn completed plus its offset within its branch
(`max(0, t0 - branch start)`).

Both idle caps of §3.4 move timers and never reorder requests: once a tree has nothing in flight
its earliest pending timer is pulled to at most `trace_idle_cap_s` after it went idle (its other
timers shift by as much), and once nothing anywhere is in flight every timer shifts so the next
fires at most `system_idle_cap_s` after the system went idle. After `duration_s` nothing is sent;
what is in flight finishes and counts (§3.4 "End of profiling").

A request that failed does not end its stream, which goes on as if it had succeeded (§3.4
"Errors"), except a context overflow (`is_context_overflow`): its turns after it are only
larger, so that stream ends there; a root turn waiting on it to join goes on.

Not yet done: the startup at a seeded t* with primers and per-lane warmup requests (§3.3) and
the nested chain splitting of subagents (§2.3); every lane starts its first trace at turn 0.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .workload import DEFAULT_REPLAY_DURATION_S

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .trace_sessions import SessionTree, Turn

__all__ = ["CONTEXT_OVERFLOW_SUBSTRINGS", "SYSTEM_IDLE_CAP_S", "TRACE_IDLE_CAP_S", "Dispatch",
           "ReplayConfig", "ReplaySchedule", "ReplayedRequest", "is_context_overflow"]

# What an error says when the prompt did not fit the server's context: AIPerf's
# AIPERF_AGENTX_CONTEXT_OVERFLOW_SUBSTRINGS (§3.4 "Errors"), matched in lower case.
CONTEXT_OVERFLOW_SUBSTRINGS = ("context length", "maximum context", "context_length_exceeded",
                               "prompt is too long")
# InferenceX's idle caps (§3.1 scenario locks and flags, §3.4).
SYSTEM_IDLE_CAP_S = 10.0
TRACE_IDLE_CAP_S = 300.0


def is_context_overflow(error: str) -> bool:
    """Whether a failed request's error says its prompt overflowed the server's context."""
    text = error.lower()
    return any(s in text for s in CONTEXT_OVERFLOW_SUBSTRINGS)


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
    previous_end: float | None  # when the stream's previous turn ended (the caller's clock)


@dataclass(frozen=True)
class Dispatch:
    """One request to send now: its turn, where it belongs, and when the schedule wanted it."""

    key: int  # what `complete` is told
    lane: int
    play: int  # the tree's play number: its cache-bust marker's key
    tree: SessionTree
    turn: Turn
    due: float | None  # the due time before any idle cap moved it; None: a lane's first turn
    at: float  # when it fell due: its timer as the caps moved it, or when it became ready
    previous_end: float | None

    def described(self) -> ReplayedRequest:
        r, trace = self.turn.request, self.tree.trace
        return ReplayedRequest(
            lane=self.lane, play=self.play, trace_id=trace.id, session_id=self.turn.session_id,
            turn=self.turn.index, input_length=r.input_length, output_length=r.output_length,
            hit_blocks=self.turn.hit_blocks, total_blocks=self.turn.total_blocks,
            block_size=trace.block_size, delay_s=self.turn.delay,
            previous_end=self.previous_end)


@dataclass
class _Stream:
    turns: tuple[Turn, ...]
    pos: int = 0  # the next turn to send
    previous_end: float | None = None
    outcome: bool | None = None  # True: every turn sent and done; False: cut by the end
    joining: bool = False  # a root turn waits for the subagents it joins


@dataclass
class _Play:
    lane: int
    play: int
    tree: SessionTree
    streams: dict[str, _Stream] = field(default_factory=dict)  # root first, then spawned
    in_flight: int = 0
    idle_since: float | None = None
    timers: dict[int, list[float]] = field(default_factory=dict)  # timer key -> [due]

    @property
    def root(self) -> _Stream:
        return self.streams[self.tree.trace.id]


@dataclass(frozen=True)
class _Pending:
    play: _Play
    session: str
    due: float | None
    at: float  # when it became ready (a timer's: set when it fires)


class ReplaySchedule:
    """The schedule of one replay of `trees` at `concurrency` lanes from `start` (module doc)."""

    def __init__(self, trees: Sequence[SessionTree], concurrency: int, cfg: ReplayConfig,
                 start: float) -> None:
        if not trees:
            raise ValueError("no traces to replay")
        if not all(t.streams.get(t.trace.id) for t in trees):
            raise ValueError("a trace to replay has no top-level request")
        self.trees = trees
        self.cfg = cfg
        self.end = start + cfg.duration_s
        self.plays = 0  # trees started
        self.plays_completed = 0  # trees whose every stream sent every turn
        self.total_in_flight = 0
        self._system_idle_since: float | None = None
        self._ready: list[_Pending] = []  # due at once, in the order they became ready
        self._timers: list[tuple[float, int]] = []  # heap of (due as set, timer key)
        self._timer_of: dict[int, tuple[_Play, _Pending, list[float]]] = {}
        self._sent: dict[int, tuple[_Play, str]] = {}
        self._next_key = 0
        self._live: dict[int, _Play] = {}
        for lane in range(concurrency):
            self._new_play(lane, start)

    # ----------------------------------------------------------------- the caller's questions
    def take(self, now: float) -> list[Dispatch]:
        """Everything due by `now`, now in flight (after the end: nothing, and every timer
        is dropped)."""
        if now >= self.end:
            self._close()
            return []
        while self._timers and self._timers[0][0] <= now:
            _, key = heapq.heappop(self._timers)
            entry = self._timer_of.get(key)
            if entry is None:
                continue
            play, pending, due = entry
            if due[0] > now:  # stale heap entry of a timer a cap moved: its new one is queued
                continue
            del self._timer_of[key]
            del play.timers[key]
            self._ready.append(_Pending(play, pending.session, pending.due, due[0]))
        ready, self._ready = self._ready, []
        return [self._send(p) for p in ready]

    def next_due(self) -> float | None:
        """When the earliest timer fires (None: no timer pending)."""
        while self._timers:
            due, key = self._timers[0]
            entry = self._timer_of.get(key)
            if entry is not None and entry[2][0] == due:
                return due
            heapq.heappop(self._timers)  # fired, dropped or moved
        return None

    def finished(self, now: float) -> bool:
        """Nothing in flight and nothing left to send by the end."""
        if self.total_in_flight:
            return False
        return now >= self.end or not (self._ready or self._timer_of)

    def complete(self, key: int, t: float, *, overflow: bool = False) -> None:
        """Request `key` completed at `t`: its stream's next turn, the subagents it spawns, the
        join it releases, and the lane's next play become ready or timed. `overflow`: it
        failed on a context overflow, which ends its stream (module doc)."""
        play, session = self._sent.pop(key)
        play.in_flight -= 1
        self.total_in_flight -= 1
        if not play.in_flight:
            play.idle_since = t
        if not self.total_in_flight:
            self._system_idle_since = t
        stream = play.streams[session]
        turn = stream.turns[stream.pos]
        stream.pos += 1
        stream.previous_end = t
        if overflow:
            stream.outcome = False
            self._settled(play, session, t)
        else:
            if session == play.tree.trace.id:
                self._spawn(play, turn.index, t)
            self._advance(play, session, t)
        self._cap(play, t)

    # ----------------------------------------------------------------- internals
    def _new_play(self, lane: int, now: float) -> None:
        play = _Play(lane, self.plays, self.trees[self.plays % len(self.trees)])
        self.plays += 1  # dataset order, wrapping: the first lanes take the first traces (§3.2)
        self._live[play.play] = play
        root = play.tree.trace.id
        play.streams[root] = _Stream(play.tree.streams.get(root, ()))
        self._advance(play, root, now, first_due=None)

    def _advance(self, play: _Play, session: str, now: float, *,
                 first_due: float | None = None) -> None:
        """Queue the stream's next turn (ready or timed), or settle the stream."""
        stream = play.streams[session]
        if stream.outcome is not None:
            return
        if stream.pos >= len(stream.turns):
            stream.outcome = True
            self._settled(play, session, now)
            return
        turn = stream.turns[stream.pos]
        if session == play.tree.trace.id and stream.pos:  # a joining root turn waits
            joined = [link.session_id for link in play.tree.links
                      if link.join_turn == turn.index and link.session_id in play.streams]
            if any(play.streams[s].outcome is None for s in joined):
                stream.joining = True  # the last of them to settle advances the root again
                return
        if stream.previous_end is None:
            due = first_due
        else:
            due = stream.previous_end + (turn.delay or 0.0) * self.cfg.delay_scale
        if now >= self.end:
            stream.outcome = False
            self._settled(play, session, now)
            return
        pending = _Pending(play, session, due, now)
        if due is None or due <= now:
            self._ready.append(pending)
            return
        key = self._next_key
        self._next_key += 1
        timer = [due]
        play.timers[key] = timer
        self._timer_of[key] = (play, pending, timer)
        heapq.heappush(self._timers, (due, key))
        if not play.in_flight and play.idle_since is None:
            play.idle_since = now
        self._cap(play, now)

    def _spawn(self, play: _Play, turn: int, ended: float) -> None:
        """Start the subagents root turn `turn` spawns (a branch: same spawn and join)."""
        tree = play.tree
        spawned = [link for link in tree.links if link.spawn_turn == turn]
        for link in spawned:
            branch = [b for b in spawned if b.join_turn == link.join_turn]
            starts = [tree.streams[b.session_id][0].request.t for b in branch
                      if tree.streams.get(b.session_id)]
            own = tree.streams.get(link.session_id, ())
            offset = max(0.0, own[0].request.t - min(starts)) if own and starts else 0.0
            play.streams[link.session_id] = _Stream(own)
            self._advance(play, link.session_id, ended,
                          first_due=ended + offset * self.cfg.delay_scale)

    def _settled(self, play: _Play, session: str, now: float) -> None:
        """A stream is done: a root waiting on it may go on; a drained tree frees its lane."""
        root = play.tree.trace.id
        if session != root and play.root.joining:
            play.root.joining = False
            self._advance(play, root, now)
        if any(s.outcome is None for s in play.streams.values()):
            return
        if self._live.pop(play.play, None) is None:
            return  # the root settling above drained it already
        for key in play.timers:
            self._timer_of.pop(key, None)
        play.timers.clear()
        if all(s.outcome for s in play.streams.values()) and \
                len(play.streams) == len(play.tree.links) + 1:
            self.plays_completed += 1
        if now < self.end:
            self._new_play(play.lane, now)

    def _send(self, pending: _Pending) -> Dispatch:
        play, stream = pending.play, pending.play.streams[pending.session]
        key = self._next_key
        self._next_key += 1
        self._sent[key] = (play, pending.session)
        play.in_flight += 1
        self.total_in_flight += 1
        play.idle_since = None
        self._system_idle_since = None
        return Dispatch(key=key, lane=play.lane, play=play.play, tree=play.tree,
                        turn=stream.turns[stream.pos], due=pending.due,
                        at=pending.at, previous_end=stream.previous_end)

    def _close(self) -> None:
        """The end: every pending turn is cut; trees with nothing in flight drain."""
        if not (self._timer_of or self._ready):
            return
        cut = [(p.play, p.session) for p in self._ready]
        cut += [(play, pending.session) for play, pending, _ in self._timer_of.values()]
        self._ready.clear()
        self._timer_of.clear()
        self._timers.clear()
        for play, session in cut:
            play.timers.clear()
            stream = play.streams[session]
            if stream.outcome is None:
                stream.outcome = False
                self._settled(play, session, self.end)

    def _shift(self, play: _Play, shift: float) -> None:
        for key, timer in play.timers.items():
            timer[0] -= shift
            heapq.heappush(self._timers, (timer[0], key))

    def _cap(self, play: _Play, now: float) -> None:
        since = play.idle_since if not play.in_flight else None
        if play.timers and since is not None:
            shift = min(t[0] for t in play.timers.values()) - (since + self.cfg.trace_idle_cap_s)
            if shift > 0:
                self._shift(play, shift)
        if self.total_in_flight or not self._timer_of:
            return
        since = self._system_idle_since if self._system_idle_since is not None else now
        first = self.next_due()
        shift = 0.0 if first is None else first - (since + self.cfg.system_idle_cap_s)
        if shift > 0:
            for other in {id(p): p for p, _, _ in self._timer_of.values()}.values():
                self._shift(other, shift)
