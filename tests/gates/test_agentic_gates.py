"""The gates of an agentic point: InferenceX's validator rule in place of the failure ratio,
AIPerf's validity as an SLO with its reasons, SLO and baseline gates on the agentic metrics; a
baseline replayed otherwise (duration, lane starts, warmup: the fast mode) is another setup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_inferbench.backends.agentic_traces import replay_workload
from pytest_inferbench.gates import Gates, evaluate_point
from pytest_inferbench.gates.baseline import load_baseline, save_baseline
from pytest_inferbench.gates.rules import parse_gates
from pytest_inferbench.loadgen.replay_config import ReplayConfig
from pytest_inferbench.loadgen.workload import (
    DEFAULT_REPLAY_DURATION_S,
    FAST_REPLAY_DURATION_S,
    FAST_WARMUP_REQUESTS_PER_LANE,
    TRAJECTORY_START_RATIOS,
    WARMUP_REQUESTS_PER_LANE,
)

GATES = """\
slo:
  - match: {config: "minimaxm3-*"}
    require:
      - submission_valid >= 1
      - p90_e2e_norm_intvty >= 40
"""


def agentic_result(objs: Any, point: Any, *, errors: int = 0, completed: int = 100,
                   **values: object) -> dict[str, object]:
    validity = {"completed": completed, "errors": errors, "successes": completed - errors}
    return objs.make_result(point, num_prompts=completed, completed=completed - errors,
                            failed=errors, agentic={"validity": validity}, **values)


def test_an_agentic_point_is_judged_by_inferencex_error_rate(objs: Any) -> None:
    point, settings, gates = objs.make_point(), objs.make_settings(), Gates()
    # 5 % errors: a fixed-length point fails at the default failure ratio of 0, InferenceX's
    # validator passes it (its limit is 10 %, inclusive).
    tolerated = agentic_result(objs, point, errors=5)
    assert evaluate_point(tolerated, point, None, settings, gates, None) == []
    failed = evaluate_point(agentic_result(objs, point, errors=11), point, None, settings,
                            gates, None)
    assert failed == ["agentic: request error rate 11/100 = 11.000% > 10.000% (InferenceX's "
                      "validate_agentic_result.py)"]
    none = evaluate_point(agentic_result(objs, point, completed=0), point, None, settings,
                          gates, None)
    assert none == ["agentic: completed zero requests in the profiling phase"]


def test_validity_and_e2e_normalized_interactivity_as_slos(objs: Any, tmp_path: Path) -> None:
    point, settings = objs.make_point(), objs.make_settings()
    gates = Gates(parse_gates(GATES, tmp_path / "gates.yaml"))
    good = agentic_result(objs, point, submission_valid=1, invalid_reasons=[],
                          p90_e2e_norm_intvty=55.0)
    assert evaluate_point(good, point, None, settings, gates, None) == []
    reason = "unsafe_override: benchmark duration 60 s < 900 s"
    bad = agentic_result(objs, point, submission_valid=0, invalid_reasons=[reason],
                         p90_e2e_norm_intvty=31.5)
    where = tmp_path / "gates.yaml"
    assert evaluate_point(bad, point, None, settings, gates, None) == [
        f"submission_valid 0 < 1.00 ({where}:4): {reason}",
        f"p90_e2e_norm_intvty 31.50 tok/s/user < 40.00 tok/s/user ({where}:5)",
    ]


def test_agentic_throughput_per_gpu_is_compared_with_the_baseline(objs: Any,
                                                                  tmp_path: Path) -> None:
    point, settings = objs.make_point(), objs.make_settings()
    before = agentic_result(objs, point, agentic_tput_per_gpu=1000.0)
    save_baseline(tmp_path / "base.json", [before], {"backend": "sim"})
    baseline = load_baseline(tmp_path / "base.json")
    gates = Gates(parse_gates("regression:\n  tolerance: 5%\n", tmp_path / "gates.yaml"))
    worse = agentic_result(objs, point, agentic_tput_per_gpu=900.0)
    assert evaluate_point(worse, point, None, settings, gates, baseline) == [
        "agentic_tput_per_gpu 900.0 tok/s/GPU < baseline 1000.0 tok/s/GPU "
        f"(-10.0%, tolerance 5%; {tmp_path / 'base.json'})"]
    close = agentic_result(objs, point, agentic_tput_per_gpu=970.0)
    assert evaluate_point(close, point, None, settings, gates, baseline) == []


def test_agentic_points_alike_but_for_their_kv_tier_have_their_own_baselines(
        objs: Any, tmp_path: Path) -> None:
    point, settings = objs.make_point(), objs.make_settings()
    hbm = agentic_result(objs, point, kv_offloading="none", agentic_tput_per_gpu=1000.0)
    dram = agentic_result(objs, point, kv_offloading="dram", agentic_tput_per_gpu=600.0)
    save_baseline(tmp_path / "base.json", [dram, hbm], {"backend": "sim"})
    baseline = load_baseline(tmp_path / "base.json")
    gates = Gates(parse_gates("regression:\n  tolerance: 5%\n", tmp_path / "gates.yaml"))
    # Each as good as its own baseline: no regression, though DRAM is 40 % below HBM.
    assert evaluate_point({**hbm}, point, None, settings, gates, baseline) == []
    assert evaluate_point({**dram}, point, None, settings, gates, baseline) == []


def _replayed(duration_s: float, warmup: int,
              start: tuple[float, float] = TRAJECTORY_START_RATIOS) -> dict[str, object]:
    """The `workload` an agentic replay of these settings records."""
    replay = ReplayConfig(duration_s=duration_s, warmup_per_lane=warmup, trajectory_start=start)
    return dict(replay_workload("synthetic", (), 4, replay, (), 0, 0, "words"))


def test_a_baseline_replayed_otherwise_is_refused_naming_the_fast_mode_and_the_start(
        objs: Any, tmp_path: Path) -> None:
    point, settings = objs.make_point(), objs.make_settings()
    standard = _replayed(DEFAULT_REPLAY_DURATION_S, WARMUP_REQUESTS_PER_LANE)
    before = agentic_result(objs, point, agentic_tput_per_gpu=1000.0, workload=standard)
    save_baseline(tmp_path / "base.json", [before], {"backend": "sim"})
    baseline = load_baseline(tmp_path / "base.json")
    fast = _replayed(FAST_REPLAY_DURATION_S, FAST_WARMUP_REQUESTS_PER_LANE, (0.0, 0.5))
    now = agentic_result(objs, point, agentic_tput_per_gpu=1000.0, workload=fast)
    (failure,) = evaluate_point(now, point, None, settings, Gates(), baseline)
    lo, hi = TRAJECTORY_START_RATIOS
    assert failure == (
        "baseline not comparable: measured otherwise (replay mode 'standard' -> 'fast'; "
        f"replay duration_s {DEFAULT_REPLAY_DURATION_S!r} -> {FAST_REPLAY_DURATION_S!r}; "
        f"replay trajectory_start [{lo!r}, {hi!r}] -> [0.0, 0.5]; "
        f"replay warmup_requests_per_lane {WARMUP_REQUESTS_PER_LANE!r} -> "
        f"{FAST_WARMUP_REQUESTS_PER_LANE!r}; {tmp_path / 'base.json'}); "
        "--inferbench-baseline-any-setup compares anyway")
    across = objs.make_settings(baseline_any_setup=True)
    assert evaluate_point(now, point, None, across, Gates(), baseline) == []
    # The same replay compares as before.
    again = agentic_result(objs, point, agentic_tput_per_gpu=1000.0, workload=standard)
    assert evaluate_point(again, point, None, settings, Gates(), baseline) == []
