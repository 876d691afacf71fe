"""Per-step sums over a closed loop's decoding sequences, from per-request ranges.

A planned load (`closed_loop.py`) prices every step from what its decoding sequences add up
to: their contexts, their contexts capped at the attention window and the KV blocks they hold.
With speculative decoding each step moves a sequence's context by a drawn amount, so the sums
are taken over every (request, decode step) element. Without it a sequence's context grows by
exactly one token per step, so each request contributes an arithmetic ramp over its range of
steps, and a ramp's sum over any set of requests is a difference array plus `step x count`:
the sums cost O(requests + steps) instead of O(tokens). Blocks held are a staircase (one more
block every `block_size` steps): a floor of a ramp, summed as the ramp less its remainders,
which repeat every `block_size` steps (O(requests + block_size x steps)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    IntArray = npt.NDArray[np.int64]
    FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class DecodeSums:
    """What the decoding sequences add up to in each of a load's steps."""

    held: FloatArray  # KV blocks held (context and the tokens written), steps + 1 entries
    ctx: FloatArray  # contexts, one entry per step
    ctx_win: FloatArray  # contexts capped at the attention window (`ctx` when there is none)
    last_held: IntArray  # per request with decode steps: blocks held in its last one


def ceil_div(a: IntArray, b: int) -> IntArray:
    if b & (b - 1) == 0:  # a power of two: a shift, several times faster than a division
        out: IntArray = (a + (b - 1)) >> (b.bit_length() - 1)
        return out
    return -(-a // b)


def _ranged(at: IntArray, until: IntArray, values: IntArray | FloatArray | None, n: int
            ) -> FloatArray:
    """Per step, the sum of values[r] over the requests whose range [at, until) holds it."""
    diff = (np.bincount(at, weights=values, minlength=n + 1)
            - np.bincount(until, weights=values, minlength=n + 1))
    out: FloatArray = np.cumsum(diff[:n], dtype=np.float64)
    return out


def linear(isl: IntArray, plan: IntArray, first_decode: IntArray, steps_n: int, q: int,
           block_size: int, window: float) -> DecodeSums:
    """The sums without speculative decoding (`q` = 1 token per step): request r decodes in
    steps first_decode[r] .. first_decode[r] + plan[r] - 1 with context isl[r] + j in its
    j-th decode step. Integer sums, so they equal the element-wise sums exactly."""
    keep = plan > 0
    isl, plan, a = isl[keep], plan[keep], first_decode[keep]
    b = a + plan
    n = steps_n
    steps = np.arange(n, dtype=np.float64)
    base = (isl - a).astype(np.float64)  # context at step s is base + s
    ctx = _ranged(a, b, base, n) + steps * _ranged(a, b, None, n)
    if math.isfinite(window):
        # The context reaches the window at step `cap` and stays capped from there on.
        cap = a + np.clip(np.ceil(window - isl).astype(np.int64), 0, plan)
        ctx_win = (_ranged(a, cap, base, n) + steps * _ranged(a, cap, None, n)
                   + window * _ranged(cap, b, None, n))
    else:
        ctx_win = ctx
    x = isl + q
    last = ceil_div(x + plan - 1, block_size)
    # Blocks for context + q in decode step j: ceil((x + j) / bs), x = isl + q. Two ways to the
    # same integers, whichever touches fewer elements: an event per block boundary, or per
    # residue of x - a - 1 modulo bs a row of steps (with pages of one token, no event at all).
    if int(plan.sum()) < block_size * block_size * (n + 1):
        held = _held_by_boundaries(x, a, b, plan, last, n, block_size)
    else:
        held = _held_by_residues(x, a, b, n, block_size)
    return DecodeSums(held, ctx, ctx_win, last)


def _held_by_boundaries(x: IntArray, a: IntArray, b: IntArray, plan: IntArray, last: IntArray,
                        n: int, block_size: int) -> FloatArray:
    """ceil(x / bs) blocks in the first decode step, one more at each j >= 1 where x + j - 1
    is a multiple of the block size: one event per block boundary."""
    h0 = ceil_div(x, block_size)
    j1 = (1 - x) % block_size
    j1[j1 == 0] = block_size
    count = np.maximum(-(-(plan - j1) // block_size), 0)
    offsets = np.cumsum(count) - count
    nth = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(offsets, count)
    events = np.repeat(a + j1, count) + nth * block_size
    diff = (np.bincount(a, weights=h0, minlength=n + 2) + np.bincount(events, minlength=n + 2)
            - np.bincount(b, weights=last, minlength=n + 2))
    held: FloatArray = np.cumsum(diff[:n + 1], dtype=np.float64)
    return held


def _held_by_residues(x: IntArray, a: IntArray, b: IntArray, n: int, block_size: int
                      ) -> FloatArray:
    """In step s, ceil((x + s - a) / bs) = floor((d + s) / bs) + 1 with d = x - a - 1, and
    floor((d + s) / bs) = ((d + s) - (d + s) mod bs) / bs, whose remainder depends on d mod bs
    only: per residue, how many sequences decode in each step."""
    d = x - a - 1
    count = _ranged(a, b, None, n + 1)
    floors = _ranged(a, b, d.astype(np.float64), n + 1) + np.arange(n + 1) * count
    if block_size > 1:
        residue = d % block_size
        steps_mod = np.arange(n + 1) % block_size
        for rho in np.unique(residue).tolist():
            mine = residue == rho
            floors -= _ranged(a[mine], b[mine], None, n + 1) * ((steps_mod + rho) % block_size)
        floors /= block_size
    held: FloatArray = floors + count
    return held
