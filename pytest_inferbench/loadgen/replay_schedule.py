"""The agentic replay's schedule: what to send and when, told only when each request completed.

One schedule serves both replays: the HTTP one on the wall clock (`replay.py`) and the
simulator's in process on its virtual clock (`sim/replay_driver.py`), so both send the same
requests in the same order under the same rules (agentic.md §3). It reads no clock and does
no I/O: the caller says "request k completed at t" (`complete`) and asks what is due by now
(`take`) and when the next timer fires (`next_due`).

`concurrency` lanes (§3.2) each play one trace's session tree at a time -- the root stream and
its children (subagents and their nested agents, `trace_sessions`), which run concurrently inside
the lane -- and when the whole tree has drained the lane recycles to the next trace in dataset
order, wrapping, from turn 0 under a fresh play number (its cache-bust marker, §3.4 "Session
end"). Within a stream the next turn is due when the previous one completed plus the recorded
end-to-start gap times `delay_scale` (§2.3 "Timing per turn", §3.4 "Dispatch rule"); a turn
that joins children also waits until every one of them has settled, and each child's own
joins wait for its children in turn; a child is due when its spawning turn completed plus its
offset within its branch (`max(0, t0 - branch start)`).

The start (§3.3) is `replay_warmup.py`'s: each lane's first tree at its seeded t*, its
primers, its warmup requests, and profiling once every lane's warmup has drained.

Both idle caps of §3.4 move timers and never reorder requests: once a tree has nothing in flight
its earliest pending timer is pulled to at most `trace_idle_cap_s` after it went idle (its other
timers shift by as much), and once nothing anywhere is in flight every timer shifts so the next
fires at most `system_idle_cap_s` after the system went idle. After `duration_s` nothing is sent;
what is in flight finishes and counts (§3.4 "End of profiling").

A request that failed does not end its stream, which goes on as if it had succeeded (§3.4
"Errors"), except a context overflow (`is_context_overflow`): its turns after it are only
larger, so that stream ends there; a turn waiting on it to join goes on.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

from .replay_config import (
    CONTEXT_OVERFLOW_SUBSTRINGS,
    FROM_TURN_0,
    SYSTEM_IDLE_CAP_S,
    TRACE_IDLE_CAP_S,
    Dispatch,
    ReplayConfig,
    ReplayedRequest,
    is_context_overflow,
)
from .replay_lanes import PRIMER, PROFILE, WARMUP, Pending, Play, Stream
from .replay_warmup import ReplayWarmup

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .trace_sessions import SessionTree, SubagentLink

__all__ = ["CONTEXT_OVERFLOW_SUBSTRINGS", "FROM_TURN_0", "SYSTEM_IDLE_CAP_S",
           "TRACE_IDLE_CAP_S", "Dispatch", "ReplayConfig", "ReplaySchedule", "ReplayedRequest",
           "is_context_overflow"]

class ReplaySchedule(ReplayWarmup):
    """The schedule of one replay of `trees` at `concurrency` lanes from `start` (module doc)."""

    def __init__(self, trees: Sequence[SessionTree], concurrency: int, cfg: ReplayConfig,
                 start: float, *, hold_profile: bool = False) -> None:
        if not trees:
            raise ValueError("no traces to replay")
        if not all(t.streams.get(t.trace.id) for t in trees):
            raise ValueError("a trace to replay has no top-level request")
        self.trees = trees
        self.cfg = cfg
        self.profile_start: float | None = None  # when the warmup drained (§3.3)
        # hold_profile: once the warmup drains, profiling waits for `begin_profile` (the
        # caller reads the server's counters first, nothing in flight); `held` says it waits.
        self._hold = hold_profile
        self.held = False
        self._held_at = 0.0
        self.end = math.inf  # profile_start + duration, once profiling begins
        self.plays = 0  # trees started
        self.plays_completed = 0  # trees whose every stream sent every turn
        self.total_in_flight = 0
        self.aborted: str | None = None  # why the warmup failed and the replay stopped
        self._system_idle_since: float | None = None
        self._ready: list[Pending] = []  # due at once, in the order they became ready
        self._timers: list[tuple[float, int]] = []  # heap of (due as set, timer key)
        self._timer_of: dict[int, tuple[Play, Pending, list[float]]] = {}
        self._sent: dict[int, tuple[Play, str, str]] = {}
        self._next_key = 0
        self._live: dict[int, Play] = {}
        self._warming: dict[int, Play] = {}
        self._idle_lanes: list[int] = []  # lanes whose first tree drained in the warmup
        self._children: dict[tuple[int, str], list[SubagentLink]] = {}
        self._link_of: dict[tuple[int, str], SubagentLink] = {}
        for tree in {id(t): t for t in trees}.values():  # a tree may be listed twice
            for link in tree.links:
                self._children.setdefault((id(tree), tree.parent_of(link)), []).append(link)
                self._link_of[(id(tree), link.session_id)] = link
        primers: list[tuple[float, Play, str]] = []
        for lane in range(concurrency):
            primers += self._first_play(lane, start)
        self._spread(primers, start)
        self._maybe_profile(start)

    # ----------------------------------------------------------------- the caller's questions
    def take(self, now: float) -> list[Dispatch]:
        """Everything due by `now`, now in flight (after the end, or once aborted: nothing,
        and every timer is dropped)."""
        if now >= self.end or self.aborted is not None:
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
            self._queue(Pending(play, pending.session, pending.due, due[0], pending.kind))
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
        """Aborted, or nothing in flight and nothing left to send by the end."""
        if self.aborted is not None:
            return True
        if self.total_in_flight or self.held:
            return False
        return now >= self.end or not (self._ready or self._timer_of)

    def complete(self, key: int, t: float, *, overflow: bool = False,
                 failed: bool = False) -> None:
        """Request `key` completed at `t`: its stream's next turn, the children it spawns, the
        join it releases, and the lane's next play become ready or timed. `failed`: it failed
        (a root stream's warmup request that failed aborts the replay); `overflow`: on a
        context overflow, which ends its stream (module doc)."""
        play, session, kind = self._sent.pop(key)
        play.in_flight -= 1
        self.total_in_flight -= 1
        if not play.in_flight:
            play.idle_since = t
        if not self.total_in_flight:
            self._system_idle_since = t
        stream = play.streams[session]
        turn = stream.turns[stream.pos]
        if (failed or overflow) and kind != PROFILE and session == play.tree.trace.id:
            self.aborted = self.aborted or (
                f"the warmup request of root stream {session} (lane {play.lane}, turn "
                f"{turn.index}) failed: the replay stops before profiling, as AIPerf aborts")
        stream.pos += 1
        stream.previous_end = t
        if kind == PRIMER:  # its children's state at t* is the snapshot's
            play.primers -= 1
            stream.parked = not overflow
        if overflow:
            stream.outcome = False
            self._settled(play, session, t)
        if kind == PRIMER:
            if not play.primers and play.play in self._live:
                self._unpark(play, t)
        elif not overflow:
            self._spawn(play, session, turn.index, t)
            self._advance(play, session, t)
        self._cap(play, t)
        self._maybe_profile(t)

    # ----------------------------------------------------------------- internals
    def _new_play(self, lane: int, now: float, *, first: bool = False) -> Play | None:
        play = Play(lane, self.plays, self.trees[self.plays % len(self.trees)])
        self.plays += 1  # dataset order, wrapping: the first lanes take the first traces (§3.2)
        self._live[play.play] = play
        if first:
            return play
        root = play.tree.trace.id
        play.streams[root] = Stream(play.tree.streams.get(root, ()))
        self._advance(play, root, now, first_due=None)
        return None

    def _queue(self, pending: Pending) -> None:
        pending.play.queued += 1
        self._ready.append(pending)

    def _advance(self, play: Play, session: str, now: float, *,
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
        joined = [link.session_id for link in self._children.get((id(play.tree), session), ())
                  if link.join_turn == turn.index and link.session_id in play.streams]
        if stream.pos and any(play.streams[s].outcome is None for s in joined):
            stream.joining = True  # the last of them to settle advances it again
            return
        if play.play in self._warming:  # the warmup: no delays, the lane's budget
            if play.primers or play.warmup_left <= 0:
                stream.parked = True
                return
            play.warmup_left -= 1
            self._queue(Pending(play, session, None, now, WARMUP))
            return
        if stream.resume_due is not None:
            due: float | None = stream.resume_due
            stream.resume_due = None
        elif stream.previous_end is None:
            due = first_due
        else:
            due = stream.previous_end + (turn.delay or 0.0) * self.cfg.delay_scale
        if now >= self.end:
            stream.outcome = False
            self._settled(play, session, now)
            return
        self._timer(play, Pending(play, session, due, now), due, now)

    def _timer(self, play: Play, pending: Pending, due: float | None, now: float, *,
               cap: bool = True) -> None:
        """Queue `pending` now, or set its timer for `due` (under both idle caps)."""
        if due is None or due <= now:
            self._queue(pending)
            return
        key = self._next_key
        self._next_key += 1
        timer = [due]
        play.timers[key] = timer
        self._timer_of[key] = (play, pending, timer)
        heapq.heappush(self._timers, (due, key))
        if not play.in_flight and play.idle_since is None:
            play.idle_since = now
        if cap:
            self._cap(play, now)

    def _spawn(self, play: Play, session: str, turn: int, ended: float) -> None:
        """Start the children the stream's turn `turn` spawns (a branch: same spawn and
        join)."""
        tree = play.tree
        spawned = [link for link in self._children.get((id(tree), session), ())
                   if link.spawn_turn == turn and link.session_id not in play.streams]
        for link in spawned:
            branch = [b for b in spawned if b.join_turn == link.join_turn]
            starts = [tree.streams[b.session_id][0].request.t for b in branch
                      if tree.streams.get(b.session_id)]
            own = tree.streams.get(link.session_id, ())
            offset = max(0.0, own[0].request.t - min(starts)) if own and starts else 0.0
            play.streams[link.session_id] = Stream(own)
            self._advance(play, link.session_id, ended,
                          first_due=ended + offset * self.cfg.delay_scale)

    def _settled(self, play: Play, session: str, now: float) -> None:
        """A stream is done: a parent waiting on it may go on; a drained tree frees its lane."""
        link = self._link_of.get((id(play.tree), session))
        if link is not None:
            parent = play.tree.parent_of(link)
            if play.streams[parent].joining:
                play.streams[parent].joining = False
                self._advance(play, parent, now)
        if any(s.outcome is None for s in play.streams.values()):
            return
        if self._live.pop(play.play, None) is None:
            return  # the parent settling above drained it already
        for key in play.timers:
            self._timer_of.pop(key, None)
        play.timers.clear()
        skipped = play.start is not None and (play.start.done or play.start.resume)
        if not skipped and all(s.outcome for s in play.streams.values()) and \
                len(play.streams) == len(play.tree.links) + 1:
            self.plays_completed += 1
        if self._warming.pop(play.play, None) is not None:
            self._idle_lanes.append(play.lane)  # its next tree starts with the profiling
        elif now < self.end:
            self._new_play(play.lane, now)

    def _send(self, pending: Pending) -> Dispatch:
        play, stream = pending.play, pending.play.streams[pending.session]
        play.queued -= 1
        key = self._next_key
        self._next_key += 1
        self._sent[key] = (play, pending.session, pending.kind)
        play.in_flight += 1
        self.total_in_flight += 1
        play.idle_since = None
        self._system_idle_since = None
        return Dispatch(key=key, lane=play.lane, play=play.play, tree=play.tree,
                        turn=stream.turns[stream.pos], due=pending.due,
                        at=pending.at, previous_end=stream.previous_end,
                        warmup=pending.kind != PROFILE)

    def _close(self) -> None:
        """The end: every pending turn is cut; trees with nothing in flight drain."""
        if not (self._timer_of or self._ready):
            return
        cut = [(p.play, p.session) for p in self._ready]
        cut += [(play, pending.session) for play, pending, _ in self._timer_of.values()]
        for p in self._ready:
            p.play.queued -= 1
        self._ready.clear()
        self._timer_of.clear()
        self._timers.clear()
        for play, session in cut:
            play.timers.clear()
            stream = play.streams[session]
            if stream.outcome is None:
                stream.outcome = False
                self._settled(play, session, self.end)

    def _shift(self, play: Play, shift: float) -> None:
        for key, timer in play.timers.items():
            timer[0] -= shift
            heapq.heappush(self._timers, (timer[0], key))

    def _cap(self, play: Play, now: float) -> None:
        # Idle means nothing in flight and nothing ready to go (§3.4), for the tree and for
        # the system: a request about to leave holds the timers as one in flight does.
        since = play.idle_since if not (play.in_flight or play.queued) else None
        if play.timers and since is not None:
            shift = min(t[0] for t in play.timers.values()) - (since + self.cfg.trace_idle_cap_s)
            if shift > 0:
                self._shift(play, shift)
        if self.total_in_flight or self._ready or not self._timer_of:
            return
        since = self._system_idle_since if self._system_idle_since is not None else now
        first = self.next_due()
        shift = 0.0 if first is None else first - (since + self.cfg.system_idle_cap_s)
        if shift > 0:
            for other in {id(p): p for p, _, _ in self._timer_of.values()}.values():
                self._shift(other, shift)
