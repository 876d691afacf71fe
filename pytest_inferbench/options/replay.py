"""The agentic replay's options -> `ReplayOptions`: the duration, where each lane's first tree
starts, the warmup requests per lane, and InferenceX's fast mode.

Each is the command line's, else the ini file's, else InferenceX's default. The fast mode
(InferenceX's AIPERF_EXPERIMENTAL_FAST, agentic.md §5) forces a 1200 s replay after one warmup
request per lane, over the ini values as InferenceX's over its environment; given with either
of those options on the command line it is a usage error, not a silent choice between them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from ..loadgen.workload import (
    DEFAULT_REPLAY_DURATION_S,
    FAST_REPLAY_DURATION_S,
    FAST_WARMUP_REQUESTS_PER_LANE,
    TRAJECTORY_START_RATIOS,
    WARMUP_REQUESTS_PER_LANE,
)


@dataclass(frozen=True)
class ReplayOptions:
    duration_s: float = DEFAULT_REPLAY_DURATION_S
    trajectory_start: tuple[float, float] = TRAJECTORY_START_RATIOS
    warmup_per_lane: int = WARMUP_REQUESTS_PER_LANE
    fast: bool = False


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
    if not 0.0 <= lo <= hi <= 1.0:
        raise pytest.UsageError(
            f"trajectory start ratios {lo:g} (min) and {hi:g} (max): expected 0 <= min <= max "
            "<= 1 (--inferbench-trajectory-start-min-ratio and -max-ratio, or their ini keys)")
    warmup = FAST_WARMUP_REQUESTS_PER_LANE if fast else _number(
        given("inferbench_warmup_requests_per_lane"), "inferbench_warmup_requests_per_lane",
        ini("inferbench_warmup_requests_per_lane"), WARMUP_REQUESTS_PER_LANE)
    if warmup < 0 or warmup != int(warmup):
        raise pytest.UsageError(f"warmup requests per lane {warmup:g}: expected a whole number "
                                ">= 0 (--inferbench-warmup-requests-per-lane, "
                                "inferbench_warmup_requests_per_lane)")
    return ReplayOptions(duration_s=duration, trajectory_start=(lo, hi),
                         warmup_per_lane=int(warmup), fast=fast)


def _number(option: object | None, name: str, ini: str, default: float) -> float:
    """The option's number, else the ini key's (empty: `default`)."""
    if option is not None:
        return float(option)  # type: ignore[arg-type]  # argparse made it an int or float
    try:
        return float(ini) if ini else default
    except ValueError:
        raise pytest.UsageError(f"{name} = {ini!r}: not a number") from None
