"""The fast path: a stretch of identical decode steps priced and applied in one go.

Between scheduling events (an admission, a prefill chunk, a finish, the KV cache running out)
every step decodes the same sequences, so the only things that change are the context lengths.
With each sequence's emissions planned ahead (`SlotTable.start_decode`), the stretch's length
is the smallest number of planned steps left, cut where the KV blocks would run out, and its
step durations are one vectorized `StepCost.step` over a (sequences x steps) context matrix.
A stretch can be priced (`plan`) before it is applied (`commit`), so a caller whose engine may
receive a request during it (a deployment's instance) applies only the steps run by then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .state import StepBatch

if TYPE_CHECKING:
    import numpy.typing as npt

    from .acceptance import AcceptanceSampler
    from .engine import Engine


def advance(engine: Engine, max_steps: int, max_duration_s: float = math.inf) -> StepBatch:
    """Run up to `max_steps` steps at once when nothing can change the batch.

    When every running request is decoding and no waiting request can be admitted, the batch
    stays the same until one finishes or the KV cache runs out, so the whole stretch is priced
    in one vectorized call, stopping after the step that reaches `max_duration_s` (the next
    arrival). Otherwise it runs one ordinary `engine.step()`.
    """
    batch = run_stretch(engine, max_steps, max_duration_s)
    if batch is not None:
        return batch
    result = engine.step()
    return StepBatch(np.array([result.duration_s]), result.finished)


def run_stretch(engine: Engine, max_steps: int, max_duration_s: float = math.inf
                ) -> StepBatch | None:
    """Run the stretch if the engine is in one (one step or more); else None.

    It stops after the step that reaches `max_duration_s` (an arrival the caller must hand to
    the engine before the next step is scheduled).
    """
    stretch = plan(engine, max_steps, max_duration_s)
    return None if stretch is None else commit(engine, stretch, stretch.n)


@dataclass(frozen=True)
class Stretch:
    """A stretch priced but not yet applied: the engine is still where it began."""

    idx: npt.NDArray[np.int64]  # the running slots
    ctx0: npt.NDArray[np.int64]  # the context each of them reads at the stretch's first step
    durations: npt.NDArray[np.float64]
    # The random streams as they were before its jitter was drawn (None without jitter), so
    # a stretch cut short draws only its own steps' jitter, as step by step.
    streams: tuple[AcceptanceSampler, np.random.Generator] | None

    @property
    def n(self) -> int:
        return len(self.durations)

    def ctx(self, engine: Engine, step: int) -> npt.NDArray[np.int64]:
        """The context each sequence reads at step `step` of the stretch (its plan's tokens
        so far; one a step without drafts)."""
        if not engine.k:
            return self.ctx0 + step
        st = engine.slots
        p0 = st.p[self.idx]
        grown: npt.NDArray[np.int64] = self.ctx0 + (st.cum[self.idx, p0 + step]
                                                    - st.cum[self.idx, p0])
        return grown

    def growth(self, engine: Engine, step: int) -> npt.NDArray[np.int64]:
        """KV blocks each of its sequences adds to hold step `step`'s context plus its q tokens."""
        held = -(-(self.ctx(engine, step) + engine.k + 1) // engine.block_size)
        grown: npt.NDArray[np.int64] = np.maximum(held - engine.slots.blocks[self.idx], 0)
        return grown


def _window_sums(ctx0: npt.NDArray[np.int64], n: int, window: int) -> npt.NDArray[np.float64]:
    """Sum over sequences of min(c + s, window) for each step s < n, one token a step:
    the sequences still under the window add c + s, the rest the window."""
    c = np.sort(ctx0)
    below = np.searchsorted(c, window - np.arange(n, dtype=np.int64), side="left")
    prefix = np.concatenate(([0], np.cumsum(c)))
    steps = np.arange(n, dtype=np.int64)
    sums: npt.NDArray[np.float64] = (prefix[below] + below * steps
                                     + (len(c) - below) * window).astype(np.float64)
    return sums


def plan(engine: Engine, max_steps: int, max_duration_s: float = math.inf) -> Stretch | None:
    """Price the stretch the engine is in (None if it is in none), leaving the engine as it
    is; `commit` applies its first steps."""
    st = engine.slots
    if not engine.running or max_steps < 1:
        return None
    idx = engine.run_array()
    q = engine.k + 1
    if not st.decoding[idx].all():
        return None
    budget = engine.config.max_num_batched_tokens
    if len(idx) * q > budget:
        # Only the first budget // q decode (`Engine._schedule_decode`); the rest wait. The
        # budget left over could admit a waiting request, so the batch is fixed only when none
        # can come in.
        if engine.waiting and len(engine.running) < engine.config.max_num_seqs:
            return None
        idx = idx[:budget // q]
    elif engine.can_admit():
        return None
    p0 = st.p[idx]
    n = min(int((st.plan_steps[idx] - p0).min()), max_steps)
    if n < 1:
        return None
    ctx0 = st.ctx[idx]
    steps = np.arange(n, dtype=np.int64)
    bs = engine.block_size
    win = engine.window
    # Each sequence writes at most q tokens per step, so n steps need at most this many new
    # blocks in all; only when that could exceed the free blocks is the exact count needed.
    short = len(idx) * (-(-(n * q) // bs) + 1) > engine.free_blocks
    if engine.k or short:  # each step's contexts, (sequences x steps)
        if engine.k:
            cols = p0[:, None] + steps[None, :]
            ctx = ctx0[:, None] + (st.cum[idx[:, None], cols] - st.cum[idx, p0][:, None])
        else:
            ctx = ctx0[:, None] + steps[None, :]
        if short:
            # Blocks each step must hold before it runs: the context plus the q tokens it
            # writes.
            need = -(-(ctx + q) // bs) - st.blocks[idx, None]
            extra = np.maximum(need, 0).sum(axis=0)
            over = np.nonzero(extra > engine.free_blocks)[0]
            if len(over):
                n = int(over[0])
                if n < 1:
                    return None
                ctx = ctx[:, :n]
        ctx_sum = ctx.sum(axis=0).astype(np.float64)
        win_sum = (np.minimum(ctx, int(win)).sum(axis=0).astype(np.float64)
                   if math.isfinite(win) else ctx_sum)
    else:  # one token a step: the sums are the first step's plus a ramp
        ctx_sum = (int(ctx0.sum()) + len(idx) * steps).astype(np.float64)
        win_sum = _window_sums(ctx0, n, int(win)) if math.isfinite(win) else ctx_sum
    streams = engine.random_streams() if engine.config.jitter > 0 else None
    durations = engine.cost.stretch(float(len(idx)), ctx_sum, win_sum) * engine.jitter(n)
    if math.isfinite(max_duration_s):
        cut = int(np.searchsorted(np.cumsum(durations), max_duration_s)) + 1
        if cut < n:
            durations = durations[:max(cut, 1)]
    return Stretch(idx, ctx0, durations, streams)


def commit(engine: Engine, stretch: Stretch, n: int) -> StepBatch:
    """Apply the first `n` steps of a planned stretch (the engine has not moved since)."""
    if n < len(stretch.durations) and stretch.streams is not None:
        engine.adopt_random_streams(*stretch.streams)
        engine.jitter(n)  # the stream as if only these steps had drawn
    idx, st = stretch.idx, engine.slots
    grown = stretch.growth(engine, n - 1)  # blocks now held: enough for the last step
    engine.free_blocks -= int(grown.sum())
    st.blocks[idx] += grown
    st.advance_decode(idx, n, engine.counters_state)
    engine.steps_done += n
    # Cut short, it ends before any request's planned steps do.
    finished = engine.finish_done() if n == stretch.n else []
    engine.note_usage()
    return StepBatch(stretch.durations[:n], finished)


def note_usage_before_last(engine: Engine, stretch: Stretch) -> None:
    """Note the KV blocks held after the stretch's next-to-last step, the most it holds before
    its last step's finishes free theirs: what stepping one step at a time notes as its peak
    (`commit` notes only the end)."""
    if stretch.n < 2:
        return
    grown = int(stretch.growth(engine, stretch.n - 2).sum())
    engine.counters_state.note_usage(engine.num_blocks - engine.free_blocks + grown,
                                     engine.num_blocks, len(engine.waiting))
