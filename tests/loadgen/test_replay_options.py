"""The agentic replay's start options: the trajectory start ratios, the warmup requests per lane
and InferenceX's fast mode, from the command line or the ini file, into every point's replay;
a bad value is a usage error naming where it came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_inferbench.backends.agentic_traces import replay_workload
from pytest_inferbench.loadgen.replay_config import ReplayConfig, replay_config
from pytest_inferbench.loadgen.replay_schedule import ReplaySchedule
from pytest_inferbench.loadgen.synthetic_traces import (
    SyntheticTraceSettings,
    write_synthetic_traces,
)
from pytest_inferbench.loadgen.trace_sessions import sessions
from pytest_inferbench.loadgen.traces import load_traces
from pytest_inferbench.options import Settings
from pytest_inferbench.state import create_session_state


def _replay(pytester: pytest.Pytester, *args: str) -> ReplayConfig:
    """The replay a point of a run with `args` plays (the session's load settings)."""
    config = pytester.parseconfig(*args)
    return replay_config(create_session_state(config).load)


def test_inferencex_defaults_without_options(pytester: pytest.Pytester) -> None:
    replay = _replay(pytester)
    assert (replay.duration_s, replay.trajectory_start, replay.warmup_per_lane) == \
        (3600.0, (0.25, 0.75), 10)


def test_the_options_reach_the_replay(pytester: pytest.Pytester) -> None:
    replay = _replay(pytester, "--inferbench-trajectory-start-min-ratio=0.1",
                     "--inferbench-trajectory-start-max-ratio=0.2",
                     "--inferbench-warmup-requests-per-lane=3", "--inferbench-seed=9")
    assert (replay.trajectory_start, replay.warmup_per_lane, replay.seed) == ((0.1, 0.2), 3, 9)


def test_the_ini_keys_and_the_command_line_over_them(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ninferbench_trajectory_start_min_ratio = 0\n"
                     "inferbench_trajectory_start_max_ratio = 0.5\n"
                     "inferbench_warmup_requests_per_lane = 0\n")
    replay = _replay(pytester)
    assert (replay.trajectory_start, replay.warmup_per_lane) == ((0.0, 0.5), 0)
    replay = _replay(pytester, "--inferbench-warmup-requests-per-lane=4")
    assert replay.warmup_per_lane == 4


def test_the_fast_mode_is_inferencex_s(pytester: pytest.Pytester) -> None:
    """AIPERF_EXPERIMENTAL_FAST: 1200 s after one warmup request per lane, over the ini file's
    duration as InferenceX's fast mode over its DURATION."""
    pytester.makeini("[pytest]\ninferbench_replay_duration = 900\n")
    replay = _replay(pytester, "--inferbench-agentic-fast")
    assert (replay.duration_s, replay.warmup_per_lane) == (1200.0, 1)
    pytester.makeini("[pytest]\ninferbench_agentic_fast = true\n")
    assert Settings.from_config(pytester.parseconfig()).replay.fast


def test_the_result_says_how_the_replay_started(pytester: pytest.Pytester,
                                               tmp_path: Path) -> None:
    file = write_synthetic_traces(tmp_path / "t.jsonl", SyntheticTraceSettings(traces=1))
    trees = [sessions(t) for t in load_traces(file)]
    replay = _replay(pytester, "--inferbench-agentic-fast",
                     "--inferbench-trajectory-start-min-ratio=0.5")
    workload = replay_workload("t.jsonl", trees, 2, replay, (), 0, 0, "words")
    assert (workload["duration_s"], workload["trajectory_start"],
            workload["warmup_requests_per_lane"]) == (1200.0, [0.5, 0.75], 1)


def test_a_fast_lane_sends_one_warmup_request_after_its_primers(pytester: pytest.Pytester,
                                                               tmp_path: Path) -> None:
    file = write_synthetic_traces(tmp_path / "t.jsonl",
                                  SyntheticTraceSettings(traces=1, turns=30, subagents=0))
    trees = [sessions(t) for t in load_traces(file)]
    replay = _replay(pytester, "--inferbench-agentic-fast")
    schedule = ReplaySchedule(trees, 1, replay, 0.0)
    primer = schedule.take(0.0)
    assert len(primer) == 1 and primer[0].warmup
    schedule.complete(primer[0].key, 0.1)
    warmup = schedule.take(0.1)
    assert len(warmup) == 1 and warmup[0].warmup
    schedule.complete(warmup[0].key, 0.2)
    assert schedule.profile_start == 0.2  # profiling begins after that one


@pytest.mark.parametrize(("args", "ini", "message"), [
    (("--inferbench-trajectory-start-min-ratio=0.8",), "",
     "*trajectory start ratios 0.8 (min) and 0.75 (max): expected 0 <= min <= max <= 1*"),
    (("--inferbench-trajectory-start-max-ratio=1.5",), "", "*0.25 (min) and 1.5 (max)*"),
    (("--inferbench-warmup-requests-per-lane=-1",), "",
     "*warmup requests per lane -1: expected a whole number >= 0*"),
    ((), "inferbench_warmup_requests_per_lane = ten",
     "*inferbench_warmup_requests_per_lane = 'ten': not a number*"),
    ((), "inferbench_warmup_requests_per_lane = 2.5", "*warmup requests per lane 2.5*"),
    (("--inferbench-agentic-fast", "--inferbench-replay-duration=60"), "",
     "*--inferbench-agentic-fast runs 1200 s after 1 warmup request per lane (InferenceX's "
     "fast mode): drop --inferbench-replay-duration, or the fast mode*"),
    (("--inferbench-agentic-fast", "--inferbench-warmup-requests-per-lane=0"), "",
     "*drop --inferbench-warmup-requests-per-lane*"),
], ids=["min-over-max", "max-over-1", "negative", "ini-word", "ini-fraction", "fast-duration",
        "fast-warmup"])
def test_bad_values_are_usage_errors(pytester: pytest.Pytester, args: tuple[str, ...], ini: str,
                                     message: str) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str()
