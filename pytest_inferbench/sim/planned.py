"""What a planned load hands the driver, the step terms both planners price, and the client's
turn after each step both replay.

`closed_loop._Schedule` and `kv_schedule.KVSchedule` replay a closed loop's schedule in step
space; both record every prefill chunk and price the steps from per-step sums afterwards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections import deque

    import numpy.typing as npt

    from .acceptance import AcceptanceSampler
    from .decode_sums import DecodeSums
    from .engine import Engine
    from .state import CounterState

    IntArray = npt.NDArray[np.int64]
    FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class PlannedFinishes:
    """A planned load's requests in finish order, as columns (no object per request): index,
    the step it was sent after (-1: at the start), the step whose end emitted its first token
    (its chunks come from that step and the ones right after; -1 where a preemption broke its
    steps: `broken` has them by position), its chunks, the step that first computed part of
    its prompt; and with drafts every chunk's tokens, in request order (request after
    request; None: one each)."""

    index: list[int]
    sent_after: list[int]
    first_step: list[int]
    chunks: list[int]
    scheduled: list[int]
    tokens: IntArray | None
    broken: dict[int, IntArray] = field(default_factory=dict)


def client_turn(step: int, waiting: deque[int], transit: list[int], done: list[int],
                running: int, sent: int, sent_after: list[int], finish_order: list[int]
                ) -> tuple[list[int], int]:
    """The driver after step `step`, as the virtual-time driver acts: requests sent after the
    last step reach the engine now; each of this step's finishes (`done`, in the engine's order)
    frees a client slot that sends the next request, in transit for one step when the engine
    still has work (`running` requests or a waiting one), else waiting at once. Returns the
    requests now in transit and how many are sent."""
    if transit:
        waiting.extend(transit)
        transit = []
    if done:
        busy = bool(waiting or running)
        for r in done:
            finish_order.append(r)
            if sent < len(sent_after):
                sent_after[sent] = step
                (transit if busy else waiting).append(sent)
                sent += 1
    return transit, sent


def prefill_terms(at: IntArray, c0: IntArray, c1: IntArray, completes: IntArray, steps_n: int,
                  window: float) -> FloatArray:
    """Per step, what its prefill chunks add up to: tokens, completed prompts, contexts,
    contexts capped at the window, attention pairs, pairs within the window (the rows of the
    returned 6 x steps array), from each chunk's step (`at`), the prompt positions it computed
    (`c0` < position <= `c1`) and whether it completed its prompt."""
    lo, hi = c0.astype(np.float64), c1.astype(np.float64)
    full = (hi * (hi + 1) - lo * (lo + 1)) / 2.0
    if math.isfinite(window):  # as physics.windowed_sum, chunk by chunk
        below = np.minimum(lo, window)
        part = np.where(window > lo, (window * (window + 1) - below * (below + 1)) / 2.0, 0.0)
        win_pairs = np.where(window >= hi, full, part + (hi - np.maximum(lo, window)) * window)
        ctx_win = np.minimum(hi, window)
    else:
        win_pairs, ctx_win = full, hi
    weights = (hi - lo, completes.astype(np.float64), hi, ctx_win, full, win_pairs)
    terms: FloatArray = np.stack([
        np.bincount(at, weights=w, minlength=steps_n)[:steps_n].astype(np.float64)
        for w in weights])
    return terms


def price_steps(engine: Engine, jitter_rng: np.random.Generator, seqs: FloatArray,
                sums: DecodeSums, pre: FloatArray) -> FloatArray:
    """Every planned step's duration from its decoding sequences, their context sums and its
    prefill terms (`prefill_terms`' rows), jittered as the engine's steps are."""
    durations = np.asarray(engine.cost.step(
        decode_seqs=seqs, decode_ctx=sums.ctx, decode_ctx_win=sums.ctx_win,
        prefill_tokens=pre[0], prefill_seqs=pre[1], prefill_ctx=pre[2], prefill_ctx_win=pre[3],
        prefill_pairs=pre[4], prefill_win_pairs=pre[5]), dtype=np.float64)
    if engine.config.jitter > 0:
        durations = durations * np.clip(jitter_rng.lognormal(0.0, engine.config.jitter,
                                                             len(seqs)), 0.3, 3.0)
    return durations


def commit(engine: Engine, isl: IntArray, osl: IntArray, sampler: AcceptanceSampler,
           jitter_rng: np.random.Generator, steps_n: int) -> CounterState:
    """Leave the engine where the step-by-step run would have: its totals, random streams and
    step count (the caller adds what only its plan knows to the returned counters)."""
    c = engine.counters_state
    c.prompt_tokens += int(isl.sum())
    c.generation_tokens += int(osl.sum())
    c.requests_finished += len(isl)
    engine.adopt_random_streams(sampler, jitter_rng)
    engine.steps_done += steps_n
    return c
