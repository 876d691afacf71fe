"""What the agentic replay's schedule (`replay_schedule.py`) keeps of each lane's play: the
tree's streams and where each stands, the play's timers and warmup state, and a request ready
to go with its kind (a primer, a lane's warmup request, or a profiled one). Plain records: no
clock, no I/O; only the schedule changes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .replay_start import StartPoint
    from .trace_sessions import SessionTree, Turn

__all__ = ["PRIMER", "PROFILE", "WARMUP", "Pending", "Play", "Stream"]

PRIMER, WARMUP, PROFILE = "primer", "warmup", "profile"


@dataclass
class Stream:
    turns: tuple[Turn, ...]
    pos: int = 0  # the next turn to send
    previous_end: float | None = None
    outcome: bool | None = None  # True: every turn sent and done; False: cut by the end
    joining: bool = False  # its next turn waits for the children it joins
    parked: bool = False  # held by the warmup (its primers, or the lane's warmup spent)
    resume_due: float | None = None  # its first turn after the warmup is due then


@dataclass
class Play:
    lane: int
    play: int
    tree: SessionTree
    streams: dict[str, Stream] = field(default_factory=dict)  # root first, then spawned
    in_flight: int = 0
    idle_since: float | None = None
    timers: dict[int, list[float]] = field(default_factory=dict)  # timer key -> [due]
    start: StartPoint | None = None  # a first play started at its t* (§3.3)
    primers: int = 0  # primers not yet completed
    warmup_left: int = 0  # warmup requests it may still queue
    queued: int = 0  # in the ready queue

    @property
    def root(self) -> Stream:
        return self.streams[self.tree.trace.id]


@dataclass(frozen=True)
class Pending:
    play: Play
    session: str
    due: float | None
    at: float  # when it became ready (a timer's: set when it fires)
    kind: str = PROFILE
