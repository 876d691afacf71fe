"""One engine instance of a multinode deployment: its step timeline, the stretch it is running
(applied only as far as it has run when a request reaches it) and the requests that reach it
at a step's end (`cluster.py` runs them side by side). No clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .stretch import Stretch, commit, note_usage_before_last, plan

if TYPE_CHECKING:
    import numpy.typing as npt

    from .engine import Engine


MAX_STRETCH = 1 << 20


class Timeline:
    """Start and end of every step of one instance, by the engine's step index."""

    def __init__(self) -> None:
        self.starts = np.zeros(256)
        self.ends = np.zeros(256)
        self.n = 0

    def add(self, start: float, durations: npt.NDArray[np.float64]) -> float:
        k = len(durations)
        if self.n + k > len(self.ends):
            grow = max(len(self.ends), k)
            self.starts = np.concatenate([self.starts, np.zeros(grow)])
            self.ends = np.concatenate([self.ends, np.zeros(grow)])
        self.starts[self.n] = start
        if k == 1:  # a single step (most of a busy instance's): no arrays
            end = start + float(durations[0])
            self.ends[self.n] = end
            self.n += 1
            return end
        ends = start + durations.cumsum()
        self.ends[self.n:self.n + k] = ends
        self.starts[self.n + 1:self.n + k] = ends[:-1]
        self.n += k
        return float(ends[-1])


@dataclass
class Instance:
    role: str
    index: int
    engine: Engine
    timeline: Timeline = field(default_factory=Timeline)
    busy_until: float | None = None  # end of the step (or stretch) it is running
    emitted: list[tuple[int, int]] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    load: float = 0.0  # what the load-aware router compares
    # Requests that reached it the instant its step ended: they join the step after next.
    deferred: list[tuple[int, int, int, bool]] = field(default_factory=list)
    deferred_hashes: dict[int, tuple[int, ...]] = field(default_factory=dict)  # their blocks
    ended_busy: bool = False  # its last step ended now with work left: it starts the next
    # A stretch it is running, priced but applied only up to when a request reaches it
    # (`settle`): nothing else can change its batch, so it runs to its next finish unless cut.
    pending: Stretch | None = None
    _pending_start: float = 0.0
    _pending_ends: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))

    def run(self, start: float, stretch: Stretch) -> None:
        """Start a planned stretch at `start`; its steps are applied when it ends or is cut."""
        self.pending = stretch
        self._pending_start = start
        self._pending_ends = start + stretch.durations.cumsum()
        self.busy_until = float(self._pending_ends[-1])
        self.finished = []

    def settle(self, now: float) -> None:
        """Apply the pending stretch through the step running at `now` (all of it once it has
        ended): a request that reaches the engine now joins the step after that one, as it
        would step by step -- after the next one if a step ends exactly now."""
        stretch = self.pending
        if stretch is None:
            return
        n = min(int(self._pending_ends.searchsorted(now, "right")) + 1, stretch.n)
        if n == stretch.n:  # it ends with finishes: its peak is the step before
            note_usage_before_last(self.engine, stretch)
        batch = commit(self.engine, stretch, n)
        self.busy_until = self.timeline.add(self._pending_start, batch.durations)
        self.finished = batch.finished
        self.pending = None

    def has_work(self) -> bool:
        return self.engine.has_work()

    def token_steps(self, request_id: int
                    ) -> tuple[slice | npt.NDArray[np.int64], npt.NDArray[np.int64], int]:
        """A finished request's steps that streamed tokens (a slice where they run on without
        a break), its tokens in each, and the step that first computed its prompt."""
        trace = self.engine.pop_trace(request_id)
        steps, first = trace.steps, trace.first_scheduled_step
        if len(steps) and steps[-1] - steps[0] + 1 == len(steps):
            return slice(int(steps[0]), int(steps[-1]) + 1), trace.tokens, first
        return steps, trace.tokens, first

    def start(self, now: float, stretch: bool) -> None:
        """Start its next step at `now` (it is idle and has work); with `stretch`, a stretch of
        identical decode steps where it is in one, run lazily (`run`)."""
        engine = self.engine
        self.ended_busy = False
        # Requests that came as its last step ended join after the next one: one step first.
        planned = plan(engine, 1 if self.deferred else MAX_STRETCH) if stretch else None
        if planned is not None and not self.deferred:
            self.run(now, planned)
            return
        if planned is not None:
            batch = commit(engine, planned, planned.n)
            durations, finished = batch.durations, batch.finished
        else:
            result = engine.step()
            durations, finished = np.array([result.duration_s]), result.finished
            if not stretch:
                self.emitted = result.emitted
        self.busy_until = self.timeline.add(now, durations)
        self.finished = finished
        for rid, prompt, max_tokens, kv_ready in self.deferred:
            engine.add_request(rid, prompt, max_tokens, kv_ready=kv_ready,
                               block_hashes=self.deferred_hashes.pop(rid, ()))
        self.deferred.clear()

    def add(self, rid: int, prompt: int, max_tokens: int, now: float,
            kv_ready: bool = False, block_hashes: tuple[int, ...] = ()) -> None:
        """A running engine composes its next step the instant the last one ends, while a
        request sent then (its slot freed by that step's finish) is still on its way: it
        joins the step after, as on the HTTP server and in the single-engine driver. An
        idle engine takes it at once. `block_hashes`: its prompt's blocks, for this
        instance's own prefix cache."""
        self.settle(now)
        if self.busy_until is None and self.ended_busy:
            self.deferred.append((rid, prompt, max_tokens, kv_ready))
            if block_hashes:
                self.deferred_hashes[rid] = block_hashes
        else:
            self.engine.add_request(rid, prompt, max_tokens, kv_ready=kv_ready,
                                    block_hashes=block_hashes)


class Declined(Exception):
    """A lean instance's engine would preempt or hold decoders back here: run on engines."""


class LeanInstance:
    """What the cluster reads of an instance that runs without an engine's slot table (the
    engine keeps its parameters, acceptance stream, step count and counters)."""

    role = ""

    def __init__(self, index: int, engine: Engine) -> None:
        self.index = index
        self.engine = engine
        self.timeline = Timeline()
        self.busy_until: float | None = None
        self.finished: list[int] = []
        self.emitted: list[tuple[int, int]] = []  # stepped one by one only: never here
        self.load = 0.0
        self.deferred: list[tuple[int, int, int, bool]] = []
        self.ended_busy = False

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.engine.block_size)
