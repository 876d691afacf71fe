"""EAGLE3 on our own coding prompts: the draft head keeps its published acceptance length.

The golden acceptance length of MiniMax-M3's EAGLE3 head was measured on SPEED-Bench's coding
prompts (`pytest_inferbench/data/golden_al/`). Our prompts are coding prompts too; we accept
at most 10% less before we call it a regression of the draft head or of the serving stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_inferbench.plugin.fixtures import PointResult

CODING_PROMPTS = [
    "Write a Python function that parses an ISO 8601 date string and returns a datetime.",
    "Refactor this loop into a list comprehension: out = [] then for x in xs: out.append(x * 2)",
    "Explain what a race condition is and show a minimal example in Go with two goroutines.",
    "Implement binary search over a sorted list of integers in Rust and add unit tests.",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "Fix the off-by-one error: for i in range(1, len(items)): print(items[i])",
    "Write a bash script that finds all files over 100 MB under a directory, largest first.",
    "Convert this callback based JavaScript function to async and await with error handling.",
]
LEAST_SHARE_OF_GOLDEN = 0.9


@pytest.mark.inferbench_server("minimaxm3-fp4-mi355x-atom-mtp", tp=4)
def test_eagle3_acceptance_on_coding_prompts(inferbench_load: Callable[..., PointResult]) -> None:
    result = inferbench_load(prompts=CODING_PROMPTS * 4, osl=512, conc=8)
    golden = result["golden_acceptance_length"]
    assert result.acceptance_length is not None, "the server reported no acceptance length"
    assert result.acceptance_length >= LEAST_SHARE_OF_GOLDEN * golden, (
        f"acceptance length {result.acceptance_length:.2f} on our coding prompts is below "
        f"{LEAST_SHARE_OF_GOLDEN:.0%} of the golden {golden:.2f}")
