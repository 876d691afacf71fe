"""One engine instance of a multinode deployment: its step timeline, the requests that reach it
at a step's end, and lower bounds on when it can next finish a request (`cluster.py` runs
them side by side). No clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    from .engine import Engine


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
        ends = start + np.cumsum(durations)
        self.ends[self.n:self.n + k] = ends
        self.starts[self.n] = start
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
    min_step_s: float = 0.0  # no step that computes a token on it takes less
    finish_bound: float | None = None  # `earliest_finish` while it runs a step, once known
    # Requests that reached it the instant its step ended: they join the step after next.
    deferred: list[tuple[int, int, int, bool]] = field(default_factory=list)
    ended_busy: bool = False  # its last step ended now with work left: it starts the next

    def add(self, rid: int, prompt: int, max_tokens: int, kv_ready: bool = False) -> None:
        """A running engine composes its next step the instant the last one ends, while a
        request sent then (its slot freed by that step's finish) is still on its way: it
        joins the step after, as on the HTTP server and in the single-engine driver. An
        idle engine takes it at once."""
        self.finish_bound = None
        if self.busy_until is None and self.ended_busy:
            self.deferred.append((rid, prompt, max_tokens, kv_ready))
        else:
            self.engine.add_request(rid, prompt, max_tokens, kv_ready=kv_ready)


def min_step_s(engine: Engine) -> float:
    """A lower bound of any step that computes a token on this engine: one decoding sequence
    or one prompt token at the shortest context (step time grows with every term), at the
    shortest jitter factor."""
    cost = engine.cost
    decode = float(cost.step(decode_seqs=1.0, decode_ctx=1.0, decode_ctx_win=1.0))
    prefill = float(cost.step(decode_seqs=0.0, decode_ctx=0.0, decode_ctx_win=0.0,
                              prefill_tokens=1.0, prefill_seqs=1.0, prefill_ctx=1.0,
                              prefill_ctx_win=1.0, prefill_pairs=1.0, prefill_win_pairs=1.0))
    return min(decode, prefill) * (0.3 if engine.config.jitter > 0 else 1.0)


def earliest_finish(inst: Instance, now: float) -> float:
    """No request finishes on `inst` before this (its requests' planned steps left)."""
    if inst.busy_until is not None and inst.finished:
        return inst.busy_until
    engine = inst.engine
    start = inst.busy_until if inst.busy_until is not None else now
    if engine.waiting or inst.deferred:
        return start + inst.min_step_s
    if not engine.running:
        return math.inf
    st = engine.slots
    run = engine.run_array()
    if not st.decoding[run].all():
        return start + inst.min_step_s
    left = int((st.plan_steps[run] - st.p[run]).min())
    return start + max(left, 1) * inst.min_step_s
