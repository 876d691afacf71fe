"""Latency statistics as vLLM `benchmark_serving` reports them: mean, median, population std
(ddof 0) and percentiles with `np.percentile`'s linear interpolation, in `<stat>_<name>_ms`
keys; also over weighted samples (a value standing for several tokens) without expanding them.
Statistics over no samples are 0.0 (vLLM's `or 0`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .metric_kinds import MS_SUFFIX, stat_names

if TYPE_CHECKING:
    from collections.abc import Sequence

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def _lerp(a: FloatArray, b: FloatArray, t: FloatArray) -> FloatArray:
    """numpy's own interpolation for `method="linear"`, so results match `np.percentile`."""
    diff = b - a
    return np.where(t >= 0.5, b - diff * (1.0 - t), a + diff * t)


def _quantiles_sorted(ordered: FloatArray, qs: Sequence[float]) -> FloatArray:
    """Linear-interpolated percentiles of an already sorted array (as `np.percentile`)."""
    n = ordered.size
    pos = np.asarray(qs, dtype=np.float64) / 100.0 * (n - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    return _lerp(ordered[lo], ordered[hi], pos - lo)


def _stat_keys(name: str, percentiles: Sequence[float], mean: float, std: float,
               qs: Sequence[float] | FloatArray) -> dict[str, float]:
    """The `<stat>_<name>_ms` keys (the metric catalog's names) from seconds."""
    values = (mean, float(qs[0]), std, *(float(q) for q in qs[1:]))
    return {f"{stat}_{name}{MS_SUFFIX}": value * 1000.0
            for stat, value in zip(stat_names(percentiles), values, strict=True)}


def _dot(a: FloatArray, b: FloatArray) -> float:
    """Sum of a * b without BLAS: ndarray.dot wakes OpenBLAS's threads, which on a busy
    machine cost ~10x the arithmetic in CPU time."""
    return float(np.einsum("i,i->", a, b))


def latency_stats(values: FloatArray, name: str, percentiles: Sequence[float]
                  ) -> dict[str, float]:
    """mean/median/std/p* of `values` (seconds) as `<stat>_<name>_ms` keys."""
    if values.size == 0:
        return _stat_keys(name, percentiles, 0.0, 0.0, [0.0] * (len(percentiles) + 1))
    # One full sort beats np.percentile's multi-kth partition by ~5x on millions of samples.
    qs = _quantiles_sorted(np.sort(values), [50.0, *percentiles])
    mean = float(values.mean())
    centered = values - mean
    std = float(np.sqrt(_dot(centered, centered) / values.size))
    return _stat_keys(name, percentiles, mean, std, qs)


# Tokens per chunk are packed into the low mantissa bits of each (non-negative) gap, so one
# integer sort orders values and carries their weights; argsort would be ~5x slower. The
# packing moves a value by at most 2**-44 of itself.
_WEIGHT_BITS = 8
_WEIGHT_MASK = (1 << _WEIGHT_BITS) - 1


def _from_sorted_counts(ordered: FloatArray, through: IntArray, qs: Sequence[float]
                        ) -> FloatArray:
    """Linear-interpolated percentiles of sorted `ordered` values, `through[i]` being how many
    samples the first i+1 values stand for (numpy's default percentile method)."""
    total = int(through[-1])
    pos = np.asarray(qs, dtype=np.float64) / 100.0 * (total - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, total - 1)
    at_lo = ordered[np.searchsorted(through, lo, side="right")]
    at_hi = ordered[np.searchsorted(through, hi, side="right")]
    return _lerp(at_lo, at_hi, pos - lo)


def _counted_quantiles(values: FloatArray, counts: IntArray, qs: Sequence[float]
                       ) -> FloatArray:
    """Exact percentiles of `values[i]` repeated `counts[i]` times (few distinct values)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    return _from_sorted_counts(ordered, np.cumsum(counts[order]), qs)


def _weighted_quantiles(values: FloatArray, weights: IntArray, qs: Sequence[float]) -> FloatArray:
    """Percentiles of `values[i]` repeated `weights[i]` times, without building that array."""
    if int(weights.max()) > _WEIGHT_MASK or bool(np.signbit(values).any()):
        return _counted_quantiles(values, weights, qs)
    keys = (values.view(np.int64) & ~_WEIGHT_MASK) | weights
    keys.sort()
    ordered = (keys & ~_WEIGHT_MASK).view(np.float64)
    return _from_sorted_counts(ordered, np.cumsum(keys & _WEIGHT_MASK), qs)


def weighted_stats(values: FloatArray, weights: IntArray, name: str,
                   percentiles: Sequence[float]) -> dict[str, float]:
    """Statistics of `values[i]` repeated `weights[i]` times (token-weighted ITL)."""
    if weights.size and int(weights.min()) <= 0:
        keep = weights > 0
        values, weights = values[keep], weights[keep]
    total = int(weights.sum())
    if total == 0:
        return latency_stats(np.zeros(0), name, percentiles)
    if total == weights.size:  # one token per chunk: per-token ITL is the chunk ITL
        return latency_stats(values, name, percentiles)
    qs = _weighted_quantiles(values, weights, [50.0, *percentiles])
    fweights = weights.astype(np.float64)
    mean = _dot(values, fweights) / total
    centered = values - mean
    std = float(np.sqrt(_dot(centered * centered, fweights) / total))
    return _stat_keys(name, percentiles, mean, std, qs)
