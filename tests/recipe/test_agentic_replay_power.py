"""The power and server counters of an agentic point on sim-server cover its profiling phase,
as its duration and token counts do, in the record's one clock (wall seconds) at any time
scale; the in-process `sim` backend's point of the same replay is the reference."""

from __future__ import annotations

from typing import Any

import pytest
from test_agentic_entries import write
from test_agentic_replay_run import B200, TP8_CONC4, _assert_one_energy, _point
from timing_verdicts import assert_only_timing_verdicts

from pytest_inferbench.sim.power import ENERGY_COUNTER, SECONDS_COUNTER

RUN = ("-p", "no:cacheprovider", "--inferbench-no-plots")
SCALE = 0.5  # the server's clock: half a wall second per model second
WALL_S = 4.0  # the sim-server replay's profiling phase, wall seconds


def _counter(deltas: dict[str, Any], suffix: str) -> float:
    """The one counter of the server's framework whose name ends so."""
    found = [v for k, v in deltas.items() if k.endswith(suffix) and "{" not in k]
    assert len(found) == 1, sorted(deltas)
    return float(found[0])


def test_a_sim_server_replay_at_a_time_scale_prices_its_profiling_phase_in_wall_seconds(
    pytester: pytest.Pytester,
) -> None:
    write(pytester.path)
    # The same model time in process: WALL_S of the server's clock at SCALE is WALL_S / SCALE
    # model seconds, and the replay's recorded gaps are scaled by SCALE over HTTP.
    pytester.runpytest(*RUN, f"--inferbench-replay-duration={WALL_S / SCALE:g}",
                       *TP8_CONC4).assert_outcomes(passed=1)
    in_process = _point(pytester)
    _assert_one_energy(in_process)
    # In a subprocess: a sim-server run's httpx must be the one its `except` clauses name.
    result = pytester.runpytest_subprocess(
        *RUN, f"--inferbench-replay-duration={WALL_S:g}", "--inferbench-backend=sim-server",
        f"--inferbench-time-scale={SCALE:g}", *TP8_CONC4)
    # On a busy machine the client's or the server's self-check may fail the point: a verdict
    # on the timings, which this test does not judge.
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == 1, outcomes
    served = _point(pytester)
    assert_only_timing_verdicts(served)
    assert served["backend"] == "sim-server" and served["time_scale"] == SCALE
    deltas = served["server_metrics"]["counter_deltas"]
    # The scrapes bracket the profiling phase: the server's token counters say exactly what
    # the point's measured records say (the warmup's primers and requests are in neither).
    assert _counter(deltas, ":prompt_tokens_total") == served["total_input_tokens"]
    assert _counter(deltas, ":generation_tokens_total") == served["total_output_tokens"]
    # One energy in one clock: mean power (per wall second, as the duration and the
    # throughputs are) x GPUs x the duration; per token from the point's token counts.
    assert served["power_valid"] == 1, served.get("power_invalid_reason")
    watts, energy = float(served["avg_power_w"]), float(served["total_gpu_energy_j"])
    assert energy == pytest.approx(watts * 8 * float(served["duration"]), rel=1e-5)
    out = int(served["total_output_tokens"])
    assert served["joules_per_output_token"] == pytest.approx(energy / out, rel=1e-5)
    joules, seconds = (float(deltas[f"{ENERGY_COUNTER}_total"]),
                       float(deltas[f"{SECONDS_COUNTER}_total"]))
    assert watts == pytest.approx(joules / (seconds * SCALE), abs=1e-3)
    assert any(f"time scale {SCALE:g}" in note for note in served["notes"]), served["notes"]
    # In model watts, the power of the in-process point: both price the same steps with the
    # same model over the same recorded think times and the same model time. The server's
    # window is the profiling phase plus the closing scrape's latency (seconds x SCALE past
    # the duration), a share w of it that may draw anything between idle and rated power; and
    # the HTTP timing (when a request joins a step) changes which steps batch together, a few
    # percent of the power above idle.
    outside = abs(seconds * SCALE - float(served["duration"])) / (seconds * SCALE)
    above_idle = float(in_process["avg_power_w"]) - B200.idle_w
    tolerance = outside * (B200.tdp_w - B200.idle_w) + 0.05 * above_idle
    assert watts * SCALE == pytest.approx(float(in_process["avg_power_w"]), abs=tolerance)
