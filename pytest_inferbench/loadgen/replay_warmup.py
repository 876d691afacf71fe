"""The start of an agentic replay (agentic.md §3.3), the part of `ReplaySchedule` that runs
before profiling; like the rest of the schedule it reads no clock and does no I/O.

The start (§3.3, `replay_start`): each lane's first tree starts at its seeded t*. The warmup
sends each stream alive at t* its last turn before t* (its primer: the context the lane
skipped), spread as AIPerf spreads them: each primer leaves its recorded lead before its lane's
t* ahead of one common instant, the same for every lane (the first primer, the one with the
longest lead, at the start), so every lane's t* lands on that instant; the idle caps move these
timers as any other. Once the lane's primers are done come the lane's next `warmup_per_lane`
requests in dependency order with no delays. Warmup requests ask for one output token and are
flagged (`Dispatch.warmup`). A root stream's warmup request that fails aborts the replay before
profiling (`aborted` says why), as AIPerf does; a child's does not. When every lane's warmup
has drained, profiling begins (`profile_start`, the duration counts from it): each stream's
next turn is due at its recorded offset from t* after that instant (`resume_offset`); a lane
whose tree ran out in the warmup starts its next one from turn 0. A caller that reads the
server's counters first holds that instant (`hold_profile`) and starts profiling after
(`begin_profile`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .replay_lanes import PRIMER, Pending, Play, Stream
from .replay_start import resume_offset, snapshot, trajectory_start

if TYPE_CHECKING:
    from .replay_config import ReplayConfig


class ReplayWarmup:
    """`ReplaySchedule`'s start (module doc): its lanes' first trees, primers and warmup."""

    if TYPE_CHECKING:  # the schedule's state and steps these methods use (replay_schedule.py)
        cfg: ReplayConfig
        profile_start: float | None
        end: float
        aborted: str | None
        held: bool
        _hold: bool
        _held_at: float
        _system_idle_since: float | None
        _live: dict[int, Play]
        _warming: dict[int, Play]
        _idle_lanes: list[int]

        def _new_play(self, lane: int, now: float, *, first: bool = False) -> Play | None: ...
        def _advance(self, play: Play, session: str, now: float, *,
                     first_due: float | None = None) -> None: ...
        def _timer(self, play: Play, pending: Pending, due: float | None, now: float, *,
                   cap: bool = True) -> None: ...
        def _cap(self, play: Play, now: float) -> None: ...

    def _first_play(self, lane: int, now: float) -> list[tuple[float, Play, str]]:
        """The lane's first tree at its t*; its primers as (lead before t*, play, stream)."""
        play = self._new_play(lane, now, first=True)
        if play is None:
            return []
        tree, cfg = play.tree, self.cfg
        primers = []
        lo, hi = cfg.trajectory_start
        t_star = trajectory_start(tree, cfg.seed, lane, lo, hi)
        start = play.start = snapshot(tree, t_star)
        play.warmup_left = cfg.warmup_per_lane
        self._warming[play.play] = play
        for session in (tree.trace.id, *(k.session_id for k in tree.links)):
            if session in start.done:
                play.streams[session] = Stream(tree.streams[session], outcome=True)
            elif session in start.pending:
                play.streams[session] = Stream(tree.streams[session], parked=True)
            elif session in start.resume:
                play.streams[session] = Stream(tree.streams[session],
                                                pos=start.resume[session] - 1)
                play.primers += 1
                primer = tree.streams[session][start.resume[session] - 1].request
                primers.append((t_star - primer.t, play, session))
        if not play.primers:
            self._unpark(play, now)
        return primers

    def _spread(self, primers: list[tuple[float, Play, str]], now: float) -> None:
        """Time the primers so that every lane's t* lands on one instant (module doc)."""
        lead = max((p[0] for p in primers), default=0.0)
        for ahead, play, session in primers:
            due = now + (lead - ahead) * self.cfg.delay_scale
            self._timer(play, Pending(play, session, due, now, PRIMER), due, now, cap=False)
        for play in {id(p): p for _, p, _ in primers}.values():  # a tree's timers move as one
            self._cap(play, now)

    def _unpark(self, play: Play, now: float) -> None:
        """The lane's primers are done (or it had none), or profiling begins: its streams go
        on, in the recorded order of their next turns (which the warmup budget takes first)."""
        def recorded(session: str) -> float:
            stream = play.streams[session]
            return (stream.turns[stream.pos].request.t if stream.pos < len(stream.turns)
                    else math.inf)
        for session in sorted((s for s, st in play.streams.items() if st.parked), key=recorded):
            play.streams[session].parked = False
            self._advance(play, session, now)

    def _maybe_profile(self, now: float) -> None:
        """Every lane's warmup drained: profiling begins now (module doc)."""
        if self.profile_start is not None or self.aborted is not None or any(
                p.primers or p.in_flight or p.queued for p in self._warming.values()):
            return
        if self._hold:
            self.held, self._held_at = True, now
            return
        self.profile_start = now
        self.end = now + self.cfg.duration_s
        warmed, self._warming = list(self._warming.values()), {}
        for play in warmed:
            assert play.start is not None
            for session, stream in play.streams.items():
                if stream.outcome is None:
                    stream.resume_due = now + resume_offset(
                        play.tree, play.start.t_star, session, stream.pos) * self.cfg.delay_scale
        for play in warmed:
            if play.play in self._live:
                self._unpark(play, now)
        lanes, self._idle_lanes = self._idle_lanes, []
        for lane in lanes:
            self._new_play(lane, now)

    def begin_profile(self, now: float) -> None:
        """Profiling begins now: the warmup drained while held (`hold_profile`). The hold is
        no idle time of the replay's: the idle caps count from `now` as they would have from
        the drain."""
        held_s = now - self._held_at
        if self._system_idle_since is not None:
            self._system_idle_since += held_s
        for play in self._live.values():
            if play.idle_since is not None:
                play.idle_since += held_s
        self._hold = self.held = False
        self._maybe_profile(now)
