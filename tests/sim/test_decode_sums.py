"""The KV blocks decoding sequences hold per step, summed two ways, against every element."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_inferbench.sim import decode_sums


@pytest.mark.parametrize("block_size", [1, 2, 7, 16])
def test_blocks_held_by_boundaries_and_by_residues_are_the_element_sums(block_size: int
                                                                        ) -> None:
    rng = np.random.default_rng(block_size)
    n_req, steps_n, q = 60, 400, 1
    isl = rng.integers(1, 300, n_req)
    plan = rng.integers(1, 150, n_req)
    a = rng.integers(0, steps_n - 150, n_req)
    b, x = a + plan, isl + q
    # Every (request, decode step) element: ceil((isl + j + q) / bs) blocks in step a + j.
    brute = np.zeros(steps_n + 1)
    for r in range(n_req):
        for j in range(plan[r]):
            brute[a[r] + j] += -(-(isl[r] + j + q) // block_size)
    last = decode_sums.ceil_div(x + plan - 1, block_size)
    by_boundaries = decode_sums._held_by_boundaries(x, a, b, plan, last, steps_n, block_size)
    by_residues = decode_sums._held_by_residues(x, a, b, steps_n, block_size)
    np.testing.assert_array_equal(by_boundaries, brute)
    np.testing.assert_array_equal(by_residues, brute)
    summed = decode_sums.linear(isl, plan, a, steps_n, q, block_size, float("inf"))
    np.testing.assert_array_equal(summed.held, brute)
