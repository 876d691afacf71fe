"""The agentic replay's options -> `ReplayOptions`: the duration, where each lane's first tree
starts, the warmup requests per lane, and InferenceX's fast mode.

Each is the command line's, else the ini file's, else InferenceX's default. The fast mode
(InferenceX's AIPERF_EXPERIMENTAL_FAST, agentic.md §5) forces a 1200 s replay after one warmup
request per lane, over the ini values as InferenceX's over its environment; given with either
of those options on the command line it is a usage error, not a silent choice between them.
`ReplayStart` is `inferbench_load`'s say over the same settings, in the same ranges (`rules.py`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from ..loadgen.workload import (
    DEFAULT_REPLAY_DURATION_S,
    FAST_REPLAY_DURATION_S,
    FAST_WARMUP_REQUESTS_PER_LANE,
    TRAJECTORY_START_RATIOS,
    WARMUP_REQUESTS_PER_LANE,
)
from .rules import FLAG, START_RATIO, WARMUP_PER_LANE, Rule

if TYPE_CHECKING:
    from ..loadgen.workload import LoadSettings


@dataclass(frozen=True)
class ReplayOptions:
    duration_s: float = DEFAULT_REPLAY_DURATION_S
    trajectory_start: tuple[float, float] = TRAJECTORY_START_RATIOS
    warmup_per_lane: int = WARMUP_REQUESTS_PER_LANE
    fast: bool = False


def is_fast_mode(duration_s: object, warmup_per_lane: object) -> bool:
    """Whether a replay of this duration and warmup is InferenceX's fast mode (it is nothing
    else: the mode sets both)."""
    return (duration_s == FAST_REPLAY_DURATION_S
            and warmup_per_lane == FAST_WARMUP_REQUESTS_PER_LANE)


def replay_options(config: pytest.Config) -> ReplayOptions:
    """The run's replay options (module doc); a bad value is a usage error naming its source."""
    def given(name: str) -> object | None:
        value: object | None = config.getoption(name)
        return value

    def ini(name: str) -> str:
        return str(config.getini(name)).strip()

    fast = bool(given("inferbench_agentic_fast") or config.getini("inferbench_agentic_fast"))
    if fast:
        clash = [f"--inferbench-{name}" for name in ("replay-duration",
                                                     "warmup-requests-per-lane")
                 if given("inferbench_" + name.replace("-", "_")) is not None]
        if clash:
            raise pytest.UsageError(
                f"--inferbench-agentic-fast runs {FAST_REPLAY_DURATION_S:g} s after "
                f"{FAST_WARMUP_REQUESTS_PER_LANE} warmup request per lane (InferenceX's fast "
                f"mode): drop {' and '.join(clash)}, or the fast mode")
    duration = FAST_REPLAY_DURATION_S if fast else _number(
        given("inferbench_replay_duration"), "inferbench_replay_duration",
        ini("inferbench_replay_duration"), DEFAULT_REPLAY_DURATION_S)
    if not duration > 0 or math.isinf(duration):
        raise pytest.UsageError(f"replay duration {duration:g} s: expected a finite number of "
                                "seconds > 0 (--inferbench-replay-duration, "
                                "inferbench_replay_duration)")
    lo, hi = (_number(given(f"inferbench_trajectory_start_{end}_ratio"),
                      f"inferbench_trajectory_start_{end}_ratio",
                      ini(f"inferbench_trajectory_start_{end}_ratio"), default)
              for end, default in zip(("min", "max"), TRAJECTORY_START_RATIOS, strict=True))
    if not (START_RATIO.accepts(lo) and START_RATIO.accepts(hi) and lo <= hi):
        raise pytest.UsageError(
            f"trajectory start ratios {lo:g} (min) and {hi:g} (max): expected 0 <= min <= max "
            "<= 1 (--inferbench-trajectory-start-min-ratio and -max-ratio, or their ini keys)")
    warmup = FAST_WARMUP_REQUESTS_PER_LANE if fast else _number(
        given("inferbench_warmup_requests_per_lane"), "inferbench_warmup_requests_per_lane",
        ini("inferbench_warmup_requests_per_lane"), WARMUP_REQUESTS_PER_LANE)
    # The ini file's and argparse's numbers are floats; a whole one stands for its int.
    if not WARMUP_PER_LANE.accepts(int(warmup) if float(warmup).is_integer() else warmup):
        raise pytest.UsageError(f"warmup requests per lane {warmup:g}: expected a whole number "
                                ">= 0 (--inferbench-warmup-requests-per-lane, "
                                "inferbench_warmup_requests_per_lane)")
    return ReplayOptions(duration_s=duration, trajectory_start=(lo, hi),
                         warmup_per_lane=int(warmup), fast=fast)


@dataclass(frozen=True)
class ReplayStart:
    """`inferbench_load`'s replay start arguments, as given (None: the run's option)."""

    min_ratio: object
    max_ratio: object
    warmup_per_lane: object
    fast: object

    def numbers(self) -> list[tuple[str, object, Rule]]:
        """The arguments given, each with the rule its option keeps (the fast flag's: a
        bool)."""
        given = [("trajectory_start_min_ratio", self.min_ratio, START_RATIO),
                 ("trajectory_start_max_ratio", self.max_ratio, START_RATIO),
                 ("warmup_requests_per_lane", self.warmup_per_lane, WARMUP_PER_LANE),
                 ("agentic_fast", self.fast, FLAG)]
        return [(name, value, rule) for name, value, rule in given if value is not None]

    def conflicts(self, load: LoadSettings) -> list[str]:
        """What the arguments, each right (`numbers`), get wrong together or with the run's."""
        problems = []
        lo, hi = self._ratios(load)
        if lo > hi:
            problems.append(f"trajectory start ratios {lo:g} (min) > {hi:g} (max): expected "
                            "0 <= min <= max <= 1")
        if self.fast and self.warmup_per_lane is not None:
            problems.append(f"agentic_fast runs {FAST_REPLAY_DURATION_S:g} s after "
                            f"{FAST_WARMUP_REQUESTS_PER_LANE} warmup request per lane "
                            "(InferenceX's fast mode): drop warmup_requests_per_lane, or "
                            "agentic_fast")
        return problems

    def _ratios(self, load: LoadSettings) -> tuple[float, float]:
        lo, hi = load.trajectory_start
        return (lo if self.min_ratio is None else float(self.min_ratio),  # type: ignore[arg-type]
                hi if self.max_ratio is None else float(self.max_ratio))  # type: ignore[arg-type]

    def applied(self, load: LoadSettings, run_fast: bool) -> LoadSettings:
        """The run's load with these arguments over it (checked: `numbers`, `conflicts`). Off a
        fast run, `fast=False` goes back to InferenceX's duration and warmup: the fast mode
        stands for both of the run's."""
        duration, warmup = load.replay_duration_s, load.warmup_per_lane
        if self.fast:
            duration, warmup = FAST_REPLAY_DURATION_S, FAST_WARMUP_REQUESTS_PER_LANE
        elif self.fast is False and run_fast:
            duration, warmup = DEFAULT_REPLAY_DURATION_S, WARMUP_REQUESTS_PER_LANE
        if self.warmup_per_lane is not None:
            warmup = int(self.warmup_per_lane)  # type: ignore[call-overload]
        return dataclasses.replace(load, trajectory_start=self._ratios(load),
                                   replay_duration_s=duration, warmup_per_lane=warmup)


def _number(option: object | None, name: str, ini: str, default: float) -> float:
    """The option's number, else the ini key's (empty: `default`)."""
    if option is not None:
        return float(option)  # type: ignore[arg-type]  # argparse made it an int or float
    try:
        return float(ini) if ini else default
    except ValueError:
        raise pytest.UsageError(f"{name} = {ini!r}: not a number") from None
