"""Where a lane's first play starts (agentic.md §3.3): a seeded instant t* in the recorded
session, and the state of every stream of the tree at that instant.

t* is drawn uniformly between `lo` and `hi` of the way from the tree's first to its last
recorded request start (InferenceX passes 0.25 and 0.75), from a generator seeded by the
SHA-256 of `seed:trace_id:lane`, so the same seed gives the same start and each lane its own.

At t* each stream is in one of four states: not started yet (its first turn is after t*);
alive (it has turns on both sides: its last turn before t* is its primer, which rebuilds the
context the lane skipped, and its first turn after t* is where it resumes); done (every turn
before t*: nothing of it is sent); or not reached (its parent had not spawned it by t*, it is
spawned as recorded later). A child counts as started only once the parent turn that spawns it
lies before t*. Pure: no clock, no I/O.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .trace_sessions import SessionTree

__all__ = ["StartPoint", "resume_offset", "snapshot", "trajectory_start"]


def trajectory_start(tree: SessionTree, seed: int, lane: int, lo: float, hi: float) -> float:
    """The lane's t*: uniform in [first + lo * span, first + hi * span] of the tree's recorded
    request starts, seeded by (seed, trace id, lane)."""
    starts = [turn.request.t for turns in tree.streams.values() for turn in turns]
    first, span = min(starts), max(starts) - min(starts)
    digest = hashlib.sha256(f"{seed}:{tree.trace.id}:{lane}".encode()).digest()
    u = random.Random(int.from_bytes(digest[:8], "big")).random()
    return first + (lo + (hi - lo) * u) * span


@dataclass(frozen=True)
class StartPoint:
    """The tree at t*: each started stream's position (the index of its first turn after t*;
    its primer is the turn before), the streams already done, and the children spawned before
    t* whose first turn comes after it."""

    t_star: float
    resume: dict[str, int]  # alive streams: their first turn after t*
    done: frozenset[str]  # every turn before t*
    pending: frozenset[str]  # spawned before t*, first turn after it


def resume_offset(tree: SessionTree, t_star: float, session: str, pos: int) -> float:
    """How long after the profiling start turn `pos` of the stream is due: its recorded start
    after t*, or after what precedes it (the stream's previous turn, or the parent turn that
    spawned it) if that ended later (§3.4 "Dispatch rule": streams keep their recorded offsets
    from the boundary)."""
    turns = tree.streams[session]
    if pos >= len(turns):
        return 0.0
    before = -math.inf
    if pos:
        before = turns[pos - 1].request.end
    elif session != tree.trace.id:
        link = next(k for k in tree.links if k.session_id == session)
        before = tree.streams[tree.parent_of(link)][link.spawn_turn].request.end
    return max(0.0, turns[pos].request.t - max(t_star, before))


def snapshot(tree: SessionTree, t_star: float) -> StartPoint:
    """Every stream's state at `t_star` (module doc). A stream is started when its parent's
    spawning turn is before t* (the root always is)."""
    before = {s: sum(1 for turn in turns if turn.request.t < t_star)
              for s, turns in tree.streams.items()}
    started = {tree.trace.id}
    for link in tree.links:  # parents come before their children
        parent = tree.parent_of(link)
        if parent in started and link.spawn_turn < before[parent]:
            started.add(link.session_id)
    resume, done, pending = {}, set(), set()
    for session in started:
        n, total = before[session], len(tree.streams[session])
        if n == 0:
            pending.add(session)
        elif n == total:
            done.add(session)
        else:
            resume[session] = n
    return StartPoint(t_star=t_star, resume=resume, done=frozenset(done),
                      pending=frozenset(pending))
