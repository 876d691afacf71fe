"""Speculative decoding: the configuration and the accepted-draft-count schedule.

Engines that force acceptance (vLLM `synthetic_acceptance_length`, SGLang
`SGLANG_SIMULATE_ACC_LEN`, ATOM `--spec-decode-acceptance-length`) use the same
minimum-variance schedule: per-position unconditional acceptance rates
`[1.0] * floor(AL - 1) + [frac] + [0.0] * rest`, so every verify step accepts floor(AL - 1) or
floor(AL - 1) + 1 drafts. An explicit distribution over 0..k accepted drafts (e.g. ATOM's
measured {0: .144, 1: .120, 2: .127, 3: .609}) can replace it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy.typing as npt


class SpecConfigError(ValueError):
    """Inconsistent speculative-decoding settings; the message says which."""


@dataclass(frozen=True)
class SpecConfig:
    method: str  # "eagle3" (EAGLE/MTP-style chain drafting)
    draft_model: str | None  # checkpoint name; None = the target's own MTP head
    num_speculative_tokens: int
    acceptance_length: float | None = None  # forced AL (1 + accepted / verify steps)
    acceptance_rate: float | None = None  # forced per-draft rate, AL = 1 + rate * k
    accepted_distribution: tuple[float, ...] | None = None  # P(accepted = 0..k)
    thinking: bool = True  # pick the thinking_on golden AL when no AL is forced


def min_variance_distribution(acceptance_length: float, k: int) -> tuple[float, ...]:
    """P(accepted = 0..k) of the minimum-variance schedule for a mean acceptance length."""
    if not 1.0 <= acceptance_length <= k + 1:
        raise SpecConfigError(
            f"acceptance length {acceptance_length} out of range [1, {k + 1}] for k={k}")
    mean_accepted = acceptance_length - 1.0
    low = min(math.floor(mean_accepted), k)
    frac = mean_accepted - low
    probs = [0.0] * (k + 1)
    probs[low] += 1.0 - frac
    if frac > 0:
        probs[low + 1] += frac
    return tuple(probs)


def distribution_from_position_rates(rates: Sequence[float]) -> tuple[float, ...]:
    """vLLM `synthetic_acceptance_rates` (P(position i accepted), non-increasing) -> P(count)."""
    r = [1.0, *(float(x) for x in rates), 0.0]
    if any(b > a + 1e-12 for a, b in itertools.pairwise(r)) or not 0.0 <= r[-2] <= 1.0:
        raise SpecConfigError(f"acceptance rates must be non-increasing in [0, 1]: {list(rates)}")
    return tuple(r[i] - r[i + 1] for i in range(len(r) - 1))


def check_distribution(probs: Sequence[float], k: int) -> tuple[float, ...]:
    if len(probs) != k + 1:
        raise SpecConfigError(
            f"accepted-count distribution needs {k + 1} probabilities (0..{k}), got {len(probs)}")
    if any(p < 0 for p in probs) or abs(sum(probs) - 1.0) > 1e-3:
        raise SpecConfigError(f"accepted-count distribution must be >= 0 and sum to 1: "
                              f"{list(probs)}")
    total = sum(probs)
    return tuple(p / total for p in probs)


def resolve_distribution(spec: SpecConfig, golden_al: Callable[[], float]) -> tuple[float, ...]:
    """The accepted-count distribution the engine samples from (golden AL when nothing forced)."""
    k = spec.num_speculative_tokens
    given = [x is not None for x in
             (spec.acceptance_length, spec.acceptance_rate, spec.accepted_distribution)]
    if sum(given) > 1:
        raise SpecConfigError("give only one of acceptance length, acceptance rate and "
                              "accepted-count distribution")
    if spec.accepted_distribution is not None:
        return check_distribution(spec.accepted_distribution, k)
    if spec.acceptance_rate is not None:
        if not 0.0 <= spec.acceptance_rate <= 1.0:
            raise SpecConfigError(f"acceptance rate {spec.acceptance_rate} not in [0, 1]")
        return min_variance_distribution(1.0 + spec.acceptance_rate * k, k)
    al = spec.acceptance_length if spec.acceptance_length is not None else golden_al()
    return min_variance_distribution(min(al, k + 1.0), k)


POOL_SIZE = 1 << 16
# Stratified draws: each run of STRATA counts takes one uniform from each of STRATA equal slices
# of [0, 1), in a random order. A point's mean then sits on the configured one to well under 1%
# even over a few hundred verify steps (independent uniforms wander by ~1% there), as a pinned
# acceptance length does on a real server; the order stays random, so no sequence is favoured.
STRATA = 64
# Bit-generator steps a pool takes: the slices' order (32-bit keys, two to a step) and the
# offsets within them.
UNIFORMS_PER_POOL = POOL_SIZE // 2 + POOL_SIZE
_SLICE_BITS = STRATA.bit_length() - 1
_SLICES = np.arange(STRATA, dtype=np.uint32)


class AcceptanceSampler:
    """Draws accepted-draft counts from one seeded stream of stratified uniforms, each count
    the inverse cdf of the next uniform."""

    def __init__(self, probs: Sequence[float], rng: np.random.Generator) -> None:
        self.probs = np.asarray(probs, dtype=np.float64)
        self.k = len(self.probs) - 1
        self._cdf = np.cumsum(self.probs)
        self._cdf[-1] = 1.0
        self._rng = rng
        # Counts are at most k (<= 15 in every engine): one byte each, for pools of millions.
        self._pool = np.zeros(0, dtype=np.int8)
        self._next = 0

    def _fresh_pool(self) -> npt.NDArray[np.int8]:
        """The next POOL_SIZE counts (UNIFORMS_PER_POOL steps of the bit generator)."""
        # Each block's order: its slice indices sorted by one random key each. A key's 24 top
        # bits (what a float32 uniform is made of) go above the slice index, so one plain sort
        # of the packed words orders the slices (ties by index) and the low bits read the
        # order back off: several times cheaper than an argsort of float keys, same order.
        raw = self._rng.bit_generator.random_raw(POOL_SIZE // 2).view(np.uint32)
        keys = ((raw >> np.uint32(8)) << np.uint32(_SLICE_BITS)).reshape(-1, STRATA)
        keys |= _SLICES
        keys.sort(axis=1)
        keys &= np.uint32(STRATA - 1)
        u = (keys.reshape(-1) + self._rng.random(POOL_SIZE)) * (1.0 / STRATA)
        counts = np.zeros(POOL_SIZE, np.int8)
        # How many of the cdf's k thresholds each uniform reaches (searchsorted's "right"
        # count), one comparison pass per threshold: k is small, and this is several times
        # faster than a search per draw.
        for threshold in self._cdf[:-1].tolist():
            counts += u >= threshold
        return counts

    def draw(self, n: int) -> npt.NDArray[np.int8]:
        """The next n counts of the stream (computed POOL_SIZE at a time)."""
        available = len(self._pool) - self._next
        if n > available:
            blocks = -(-(n - available) // POOL_SIZE)
            self._pool = np.concatenate(
                [self._pool[self._next:], *(self._fresh_pool() for _ in range(blocks))])
            self._next = 0
        out = self._pool[self._next:self._next + n]
        self._next += n
        return out

    def skip(self, n: int) -> None:
        """Move the stream on by n counts as `draw(n)` would, computing only the pool it ends
        in (whole pools are a jump of the bit generator, O(log n))."""
        from_pool = min(n, len(self._pool) - self._next)
        self._next += from_pool
        rest = n - from_pool
        if rest:
            whole, part = divmod(rest, POOL_SIZE)
            self._rng.bit_generator.advance(  # type: ignore[attr-defined]
                whole * UNIFORMS_PER_POOL)
            self._pool = self._fresh_pool() if part else np.zeros(0, np.int8)
            self._next = part
