"""Accepted-draft counts: each stratified uniform counts the cdf thresholds it reaches (the
inverse cdf), so every run of STRATA counts holds each count in its configured share."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_inferbench.sim.acceptance import POOL_SIZE, STRATA, AcceptanceSampler


@pytest.mark.parametrize("probs", [(0.0, 0.17, 0.83, 0.0), (0.1, 0.2, 0.3, 0.4), (1.0,),
                                   (0.0, 0.0, 0.0, 0.5, 0.5)])
def test_draws_are_the_inverse_cdf_of_one_uniform_stream(probs: tuple[float, ...]) -> None:
    sampler = AcceptanceSampler(probs, np.random.default_rng(7))
    drawn = np.concatenate([sampler.draw(n) for n in (5, POOL_SIZE, 3)])
    stream = np.random.default_rng(7)
    cdf = np.cumsum(probs)
    cdf[-1] = 1.0
    uniforms = []
    for _ in range(2):
        # One uniform from each of STRATA slices of [0, 1) per run, the slices in random order.
        keys = stream.random((POOL_SIZE // STRATA, STRATA), dtype=np.float32)
        order = keys.argsort(axis=1).reshape(-1)
        uniforms.append((order + stream.random(POOL_SIZE)) / STRATA)
    expected = np.searchsorted(cdf, np.concatenate(uniforms), side="right")
    assert drawn.tolist() == expected[:len(drawn)].tolist()
    assert set(drawn.tolist()) <= {i for i, p in enumerate(probs) if p > 0}


@pytest.mark.parametrize("probs", [(0.0, 0.51, 0.49, 0.0), (0.0, 0.22, 0.78, 0.0),
                                   (0.144, 0.120, 0.127, 0.609)])
def test_every_run_of_strata_holds_each_count_in_its_share(probs: tuple[float, ...]) -> None:
    """A pinned acceptance length is the mean of a few hundred verify steps already: in each
    run of STRATA counts, as many reach count c as STRATA x P(count >= c), give or take one."""
    drawn = AcceptanceSampler(probs, np.random.default_rng(3)).draw(4 * POOL_SIZE)
    runs = drawn.reshape(-1, STRATA).astype(np.int64)
    for c in range(1, len(probs)):
        share = STRATA * sum(probs[c:])
        reached = (runs >= c).sum(axis=1)
        assert (np.abs(reached - share) < 1.0 + 1e-9).all(), c
    # and so over a point's few hundred verify steps the mean is the configured one to a
    # fraction of a percent (independent draws: about 1%)
    mean = sum(i * p for i, p in enumerate(probs))
    assert drawn[:20 * STRATA].mean() == pytest.approx(mean, rel=0.005)


@pytest.mark.parametrize("first, skipped", [(0, 10), (5, POOL_SIZE - 5), (3, 3 * POOL_SIZE + 11)])
def test_skipping_counts_leaves_the_stream_where_drawing_them_would(first: int,
                                                                     skipped: int) -> None:
    probs = (0.1, 0.2, 0.3, 0.4)
    drawing, skipping = (AcceptanceSampler(probs, np.random.default_rng(11)) for _ in range(2))
    drawing.draw(first)
    skipping.draw(first)
    drawing.draw(skipped)
    skipping.skip(skipped)
    assert skipping.draw(POOL_SIZE + 7).tolist() == drawing.draw(POOL_SIZE + 7).tolist()
