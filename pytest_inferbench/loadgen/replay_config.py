"""The agentic replay's settings and the words its schedule speaks: what to send
(`Dispatch`) and how a sent request is described in the result (`ReplayedRequest`).

The defaults are InferenceX's (agentic.md §3.1): the 10 s system and 300 s per-tree idle caps,
the trajectory start between 0.25 and 0.75 of each first tree (§3.3), ten warmup requests per
lane after the primers (one in InferenceX's fast mode), one output token per warmup request.
The duration and the start's defaults are those of a point's `LoadSettings` (`workload`), which
the options set; `replay_config` makes a point's replay of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from .workload import (
    DEFAULT_REPLAY_DURATION_S,
    TRAJECTORY_START_RATIOS,
    WARMUP_REQUESTS_PER_LANE,
)

if TYPE_CHECKING:
    from .trace_sessions import SessionTree, Turn
    from .workload import LoadSettings

__all__ = [
    "CONTEXT_OVERFLOW_SUBSTRINGS",
    "FROM_TURN_0",
    "SYSTEM_IDLE_CAP_S",
    "TRACE_IDLE_CAP_S",
    "TRAJECTORY_START_RATIOS",
    "WARMUP_MAX_TOKENS",
    "WARMUP_REQUESTS_PER_LANE",
    "Dispatch",
    "ReplayConfig",
    "ReplayedRequest",
    "StartSettings",
    "is_context_overflow",
    "replay_config",
]

# What an error says when the prompt did not fit the server's context: AIPerf's
# AIPERF_AGENTX_CONTEXT_OVERFLOW_SUBSTRINGS (§3.4 "Errors"), matched in lower case.
CONTEXT_OVERFLOW_SUBSTRINGS = ("context length", "maximum context", "context_length_exceeded",
                               "prompt is too long")
# InferenceX's idle caps (§3.1 scenario locks and flags, §3.4).
SYSTEM_IDLE_CAP_S = 10.0
TRACE_IDLE_CAP_S = 300.0
# The fork's one output token per warmup request (§3.3).
WARMUP_MAX_TOKENS = 1


def is_context_overflow(error: str) -> bool:
    """Whether a failed request's error says its prompt overflowed the server's context."""
    text = error.lower()
    return any(s in text for s in CONTEXT_OVERFLOW_SUBSTRINGS)


@dataclass(frozen=True)
class ReplayConfig:
    duration_s: float = DEFAULT_REPLAY_DURATION_S  # of the profiling phase: nothing after it
    system_idle_cap_s: float = SYSTEM_IDLE_CAP_S
    trace_idle_cap_s: float = TRACE_IDLE_CAP_S
    delay_scale: float = 1.0  # recorded end-to-start gaps are multiplied by it (1: as recorded)
    seed: int = 0  # of the block texts and of each lane's trajectory start
    run_id: str = ""  # the markers' key space; "" draws a fresh one, so runs never share cache
    # Where each lane's first tree starts, as fractions of its recorded span ((0, 0): at its
    # first request, with no primer), and the warmup requests each lane sends after its primers.
    trajectory_start: tuple[float, float] = TRAJECTORY_START_RATIOS
    warmup_per_lane: int = WARMUP_REQUESTS_PER_LANE

    def __post_init__(self) -> None:
        lo, hi = self.trajectory_start
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(f"trajectory start ratios must satisfy 0 <= min <= max <= 1, got "
                             f"{lo:g} and {hi:g}")
        if self.warmup_per_lane < 0:
            raise ValueError(f"warmup requests per lane must be >= 0, got "
                             f"{self.warmup_per_lane}")


def replay_config(load: LoadSettings, *, delay_scale: float = 1.0) -> ReplayConfig:
    """The replay of an agentic point under `load` (its options; `delay_scale`: the server's
    time scale, for a simulated server's clock)."""
    return ReplayConfig(duration_s=load.replay_duration_s, delay_scale=delay_scale,
                        seed=load.seed, trajectory_start=load.trajectory_start,
                        warmup_per_lane=load.warmup_per_lane)


class StartSettings(TypedDict):
    trajectory_start: tuple[float, float]
    warmup_per_lane: int


# `ReplayConfig(**FROM_TURN_0, ...)`: every lane starts at its tree's first turn, with no
# primer and no warmup, and every request is measured.
FROM_TURN_0 = StartSettings(trajectory_start=(0.0, 0.0), warmup_per_lane=0)


@dataclass(frozen=True)
class ReplayedRequest:
    """What one record of a replay was: which lane, play, stream and turn, and its timing."""

    lane: int
    play: int
    trace_id: str
    session_id: str
    turn: int
    input_length: int  # recorded `in`
    output_length: int  # recorded `out` (max_tokens), or the warmup request's one token
    hit_blocks: int  # theoretical prefix hit, trace blocks (`trace_sessions.Turn`)
    total_blocks: int
    block_size: int
    delay_s: float | None  # the recorded end-to-start gap after the stream's previous turn
    previous_end: float | None  # when the stream's previous turn ended (the caller's clock)
    warmup: bool = False  # a primer or per-lane warmup request: measured by no metric


@dataclass(frozen=True)
class Dispatch:
    """One request to send now: its turn, where it belongs, and when the schedule wanted it."""

    key: int  # what `complete` is told
    lane: int
    play: int  # the tree's play number: its cache-bust marker's key
    tree: SessionTree
    turn: Turn
    due: float | None  # the due time before any idle cap moved it; None: sent when ready
    at: float  # when it fell due: its timer as the caps moved it, or when it became ready
    previous_end: float | None
    warmup: bool = False  # a primer or per-lane warmup request (§3.3)

    @property
    def output_tokens(self) -> int:
        """max_tokens: the recorded output, or one token for a warmup request."""
        return WARMUP_MAX_TOKENS if self.warmup else max(1, self.turn.request.output_length)

    def described(self) -> ReplayedRequest:
        r, trace = self.turn.request, self.tree.trace
        return ReplayedRequest(
            lane=self.lane, play=self.play, trace_id=trace.id, session_id=self.turn.session_id,
            turn=self.turn.index, input_length=r.input_length,
            output_length=WARMUP_MAX_TOKENS if self.warmup else r.output_length,
            hit_blocks=self.turn.hit_blocks,
            total_blocks=self.turn.total_blocks, block_size=trace.block_size,
            delay_s=self.turn.delay, previous_end=self.previous_end, warmup=self.warmup)
