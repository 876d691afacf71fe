"""Accepted-draft counts: each uniform counts the cdf thresholds it reaches (the inverse cdf)."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_inferbench.sim.acceptance import POOL_SIZE, AcceptanceSampler


@pytest.mark.parametrize("probs", [(0.0, 0.17, 0.83, 0.0), (0.1, 0.2, 0.3, 0.4), (1.0,),
                                   (0.0, 0.0, 0.0, 0.5, 0.5)])
def test_draws_are_the_inverse_cdf_of_one_uniform_stream(probs: tuple[float, ...]) -> None:
    sampler = AcceptanceSampler(probs, np.random.default_rng(7))
    drawn = np.concatenate([sampler.draw(n) for n in (5, POOL_SIZE, 3)])
    stream = np.random.default_rng(7)
    cdf = np.cumsum(probs)
    cdf[-1] = 1.0
    uniforms = np.concatenate([stream.random(POOL_SIZE), stream.random(POOL_SIZE)])
    expected = np.searchsorted(cdf, uniforms, side="right")
    assert drawn.tolist() == expected[:len(drawn)].tolist()
    assert set(drawn.tolist()) <= {i for i, p in enumerate(probs) if p > 0}


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
