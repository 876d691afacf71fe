"""`inferbench_load` on an agentic-coding server takes the replay start settings the recipe items
take from their options (trajectory start ratios, warmup requests per lane, the fast mode),
defaulting to the run's, and refuses a bad one in the words of its option's rule."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_inferbench.loadgen.workload import (
    DEFAULT_REPLAY_DURATION_S,
    FAST_REPLAY_DURATION_S,
    FAST_WARMUP_REQUESTS_PER_LANE,
    WARMUP_REQUESTS_PER_LANE,
    LoadSettings,
)
from pytest_inferbench.options.replay import ReplayStart
from pytest_inferbench.options.rules import START_RATIO, WARMUP_PER_LANE

KEY = "qwen3.5-fp8-b200-sglang-agentic-mtp"
# In process on `sim`'s virtual clock, a short replay: the start settings are what is looked at.
RUN = ("-p", "no:cacheprovider", "--inferbench-no-plots", "--inferbench-replay-duration=60",
       "--inferbench-trajectory-start-min-ratio=0.3", "--inferbench-trajectory-start-max-ratio=0.6",
       "--inferbench-warmup-requests-per-lane=3", "-k", "test_")


RECIPE = f"""\
{KEY}:
  image: lmsysorg/sglang:v0.5.16-cu130
  model: Qwen/Qwen3.5-397B-A17B-FP8
  model-prefix: qwen3.5
  runner: cluster:b200-dgxc
  precision: fp8
  framework: sglang
  multinode: false
  scenarios:
    agentic-coding:
    - search-space:
      - {{ tp: 8, spec-decoding: mtp, kv-offloading: none, conc-list: [4] }}
"""


def _recipe(pytester: pytest.Pytester) -> None:
    (pytester.path / "nvidia-master.yaml").write_text(RECIPE, encoding="utf-8")


def _workloads(pytester: pytest.Pytester) -> dict[str, dict[str, Any]]:
    """Each Python test's point's `workload`, by the test's name."""
    out = {}
    for path in (pytester.path / "inferbench-results" / "points").glob("*.json"):
        if path.name.startswith("agg_"):
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        name = next(n for n in ("test_given", "test_run_s") if n.replace("_", "-") in path.name)
        out[name] = {**data, **data["inferbench"]}["workload"]
    return out


def test_the_arguments_start_the_replay_and_none_keeps_the_run_s(
        pytester: pytest.Pytester) -> None:
    _recipe(pytester)
    pytester.makepyfile(test_bench=f'''
import pytest


@pytest.mark.inferbench_server("{KEY}", tp=8)
def test_given(inferbench_load):
    inferbench_load(1024, 1024, 2, trajectory_start_min_ratio=0.0, trajectory_start_max_ratio=0.1,
                    warmup_requests_per_lane=0, check=False)


@pytest.mark.inferbench_server("{KEY}", tp=8)
def test_run_s(inferbench_load):
    inferbench_load(1024, 1024, 2, check=False)
''')
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(passed=2)
    workloads = _workloads(pytester)
    given, run = workloads["test_given"], workloads["test_run_s"]
    assert (given["trajectory_start"], given["warmup_requests_per_lane"]) == ([0.0, 0.1], 0)
    assert (run["trajectory_start"], run["warmup_requests_per_lane"]) == ([0.3, 0.6], 3)
    assert given["duration_s"] == run["duration_s"] == 60


RATIO, WARMUP = START_RATIO.expected, WARMUP_PER_LANE.expected
BAD = [
    ("trajectory_start_min_ratio=1.5", f"trajectory_start_min_ratio=1.5: expected {RATIO}"),
    ("trajectory_start_max_ratio='0.5'", f"trajectory_start_max_ratio='0.5': expected {RATIO}"),
    ("warmup_requests_per_lane=2.5", f"warmup_requests_per_lane=2.5: expected {WARMUP}"),
    ("warmup_requests_per_lane=-1", f"warmup_requests_per_lane=-1: expected {WARMUP}"),
    ("agentic_fast=1", "agentic_fast=1: expected True or False"),
    # Against the run's max ratio (0.6).
    ("trajectory_start_min_ratio=0.7", "trajectory start ratios 0.7 (min) > 0.6 (max)*"),
    ("agentic_fast=True, warmup_requests_per_lane=2",
     "agentic_fast runs 1200 s after 1 warmup request per lane*drop warmup_requests_per_lane*"),
]


@pytest.mark.parametrize(("arguments", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_argument_fails_the_test_naming_it(pytester: pytest.Pytester, arguments: str,
                                                 message: str) -> None:
    _recipe(pytester)
    pytester.makepyfile(test_bench=f'''
import pytest


@pytest.mark.inferbench_server("{KEY}", tp=8)
def test_bad(inferbench_load):
    inferbench_load(1024, 1024, 2, {arguments})
''')
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    # fnmatch reads "[0, 1]" as a character class: "[[]" matches the bracket itself.
    result.stdout.fnmatch_lines([f"*inferbench_load: {message.replace('[', '[[]')}*"])
    assert "Traceback" not in result.stdout.str()
    assert not (pytester.path / "inferbench-results" / "points").is_dir() or not any(
        (pytester.path / "inferbench-results" / "points").glob("*test_bad*"))


def test_the_fast_mode_argument_is_inferencex_s_fast_mode() -> None:
    """True: 1200 s after one warmup request per lane; False on a fast run: InferenceX's
    duration and warmup; None: the run's (here a 90 s run with 4 warmup requests per lane)."""
    run = LoadSettings(replay_duration_s=90.0, warmup_per_lane=4)
    fast = ReplayStart(None, None, None, True).applied(run, run_fast=False)
    assert (fast.replay_duration_s, fast.warmup_per_lane) == (
        FAST_REPLAY_DURATION_S, FAST_WARMUP_REQUESTS_PER_LANE)
    fast_run = LoadSettings(replay_duration_s=FAST_REPLAY_DURATION_S,
                            warmup_per_lane=FAST_WARMUP_REQUESTS_PER_LANE)
    slow = ReplayStart(None, None, 5, False).applied(fast_run, run_fast=True)
    assert (slow.replay_duration_s, slow.warmup_per_lane) == (DEFAULT_REPLAY_DURATION_S, 5)
    slow = ReplayStart(None, None, None, False).applied(fast_run, run_fast=True)
    assert slow.warmup_per_lane == WARMUP_REQUESTS_PER_LANE
    kept = ReplayStart(None, None, None, None).applied(run, run_fast=False)
    assert (kept.replay_duration_s, kept.warmup_per_lane) == (90.0, 4)
