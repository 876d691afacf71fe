"""The rules a number of the load must keep, each stated once: preflight holds the command-line
options to them and `inferbench_load` its arguments, so that a value refused on the command line
is refused as an argument, with the same words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..loadgen.workload import MAX_SEED
from ..recipe.model import MAX_CONCURRENCY

# Below one request a day on average a point's first request would wait for days (or, near
# 1e-300, for ever): a typo, never a benchmark.
MIN_REQUEST_RATE = 1 / 86400


@dataclass(frozen=True)
class Rule:
    """A number within [low, high] (`low_open`: low itself excluded); `integer`: an int, not a
    float with no fraction; `allow_inf`: inf is a meaning of its own (a closed loop)."""

    expected: str  # what the message says is expected
    low: float
    high: float = math.inf
    integer: bool = False
    low_open: bool = False
    allow_inf: bool = False
    flag: bool = False  # True or False, no number

    def accepts(self, value: object) -> bool:
        if self.flag:
            return isinstance(value, bool)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if math.isnan(value) or (math.isinf(value) and not self.allow_inf):
            return False
        if math.isinf(value) and self.allow_inf:
            return value > 0
        return not (value < self.low or (self.low_open and value == self.low)
                    or value > self.high)


REQUEST_RATE = Rule(f"requests per second > 0 with a mean gap of at most a day (>= "
                    f"{MIN_REQUEST_RATE:.3g}), or inf for a closed loop",
                    low=MIN_REQUEST_RATE, allow_inf=True)
PROMPTS_PER_CONC = Rule("an integer within [1, 100000]", low=1, high=100_000, integer=True)
SEED = Rule(f"an integer within [0, {MAX_SEED}]", low=0, high=MAX_SEED, integer=True)
# As a recipe's isl, osl and concurrency (recipe/yaml_walk.py) are held.
TOKENS = Rule("an integer >= 1 (tokens)", low=1, integer=True)
CONCURRENCY = Rule(f"an integer within [1, {MAX_CONCURRENCY}]", low=1, high=MAX_CONCURRENCY,
                   integer=True)
# An agentic replay's start (options/replay.py, `inferbench_load`): where each lane's first tree
# starts, as a share of its turns, and its warmup requests.
START_RATIO = Rule("a number within [0, 1]", low=0.0, high=1.0)
WARMUP_PER_LANE = Rule("an integer >= 0", low=0, integer=True)
FLAG = Rule("True or False", low=0, flag=True)
