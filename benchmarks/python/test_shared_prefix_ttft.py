"""Time to first token when every request carries the same long context (a repository's code
in front of each question), at concurrency 16.

The recipes' servers run without prefix caching, so each request prefills the whole context.
Prefill is compute-bound: batching 16 prefills saves little over doing them one after another,
so the slowest first token lands close to 16 x the first token of one request alone. What this
catches is worse than that: preemption and recomputation under KV pressure, or decodes that
starve the prefills.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_inferbench.plugin.fixtures import PointResult

CONTEXT_WORDS = 8000
CODE_WORDS = ("def", "class", "return", "import", "self", "yield", "async", "await", "with")
CONC = 16
QUESTIONS = ["Where is the retry logic?", "Which function parses the config?",
             "What does the scheduler do when the queue is full?", "List the public classes."]


def prompts(count: int) -> list[str]:
    words = itertools.cycle(CODE_WORDS)
    context = " ".join(itertools.islice(words, CONTEXT_WORDS))
    return [f"{context}\nQuestion {i}: {QUESTIONS[i % len(QUESTIONS)]}" for i in range(count)]


@pytest.mark.inferbench_server("minimaxm3-fp4-mi355x-atom", tp=4)
def test_ttft_with_a_long_shared_context(inferbench_load: Callable[..., PointResult]) -> None:
    alone = inferbench_load(prompts=prompts(4), osl=64, conc=1)
    loaded = inferbench_load(prompts=prompts(CONC * 2), osl=64, conc=CONC)
    serial = CONC * alone["median_ttft"]
    assert loaded["p99_ttft"] < serial, (
        f"p99 TTFT {loaded['p99_ttft']:.3f} s at concurrency {CONC} is no better than "
        f"prefilling the requests one by one ({serial:.3f} s)")
