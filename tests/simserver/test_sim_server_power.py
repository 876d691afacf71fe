"""Power figures of simulated HTTP server points: the server exports the energy its power model
priced (`/metrics`), and the `sim-server` backend turns its differences over the measured phase
into InferenceX's power keys, as the in-process `sim` backend does."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

# In-process pytester runs drop modules first imported during a run; numpy cannot be imported
# twice in one process, and httpx (which imports httpcore on first use) maps httpcore's errors
# by class, so a second httpcore's errors would escape it: httpcore and the simulator are
# imported here, once.
import httpcore  # noqa: F401
import httpx
import pytest
from calibration_project import only_record, write_project
from timing_verdicts import assert_only_timing_verdicts

import pytest_inferbench.backends.sim  # noqa: F401
from pytest_inferbench.sim.power import ENERGY_COUNTER, SECONDS_COUNTER, gpu_power

from .conftest import ATOM_ARGV, MODEL
from .promtext import scrape, value

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_inferbench.sim.server.launcher import SimServer

FLAGS = ("-p", "no:cacheprovider", "--inferbench-no-plots")
MI355X = gpu_power("MI355X")


def _counters(server: SimServer) -> tuple[float, float]:
    samples = scrape(server.base_url)
    return (value(samples, f"{ENERGY_COUNTER}_total", simulated="true"),
            value(samples, f"{SECONDS_COUNTER}_total", simulated="true"))


def test_the_server_exports_the_energy_of_the_steps_it_ran(
        start_server: Callable[..., SimServer]) -> None:
    server = start_server(ATOM_ARGV, ("--hardware", "MI355X", "--time-scale", "0"))
    assert _counters(server) == (0.0, 0.0)  # no clock at scale 0: only steps count
    response = httpx.post(f"{server.base_url}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "word " * 2000, "max_tokens": 32, "ignore_eos": True})
    assert response.status_code == 200
    joules, seconds = _counters(server)
    assert seconds > 0
    # Every second it covers was a step's: above idle, at most the rated power.
    assert MI355X.idle_w < joules / seconds <= MI355X.tdp_w


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return write_project(pytester)


def test_sim_server_points_carry_the_power_of_the_servers_model(
        project: pytest.Pytester) -> None:
    project.runpytest(*FLAGS).assert_outcomes(passed=1)
    in_process = only_record(project)
    result = project.runpytest(*FLAGS, "--inferbench-backend", "sim-server")
    # On a busy machine the client's self-check may fail the point (its event loop stalled
    # while it timed the streams): a verdict on the timings, which this test does not judge.
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == 1, outcomes
    served = only_record(project)
    assert_only_timing_verdicts(served)
    assert served["backend"] == "sim-server"
    assert served["power_valid"] == 1, served.get("power_invalid_reason")
    assert served["power_source"] == "simulated" and served["power_num_gpus"] == 4
    watts, energy = float(served["avg_power_w"]), float(served["total_gpu_energy_j"])
    assert MI355X.idle_w < watts <= MI355X.tdp_w
    # The mean power is the counters' over the measured phase.
    server_metrics = served["server_metrics"]
    assert isinstance(server_metrics, dict)
    deltas = server_metrics["counter_deltas"]
    joules, seconds = deltas[f"{ENERGY_COUNTER}_total"], deltas[f"{SECONDS_COUNTER}_total"]
    assert watts == pytest.approx(joules / seconds, abs=1e-3)
    # One request at a time, the server ran the in-process point's steps, priced by the same
    # model: the energy above idle is the same (the idle time is the client's, between its
    # requests, and the machine's).
    above_idle = joules - MI355X.idle_w * seconds
    reference = (float(in_process["avg_power_w"]) - MI355X.idle_w) * float(in_process["duration"])
    assert above_idle == pytest.approx(reference, rel=1e-3)
    # One energy: mean power x GPUs x the point's duration, and per token from its counts.
    assert energy == pytest.approx(watts * 4 * float(served["duration"]), rel=1e-3)
    out, total = int(served["total_output_tokens"]), int(served["total_input_tokens"])
    total += out
    assert served["joules_per_output_token"] == pytest.approx(energy / out, rel=1e-3)
    assert served["joules_per_total_token"] == pytest.approx(energy / total, rel=1e-3)
    agg = json.loads((project.path / "inferbench-results" / "points"
                      / f"agg_{served['result_filename']}.json").read_text())
    assert agg["power_valid"] == 1 and agg["avg_power_w"] == served["avg_power_w"]


def test_at_time_scale_0_sim_server_points_say_why_they_have_no_power(
        project: pytest.Pytester) -> None:
    result = project.runpytest(*FLAGS, "--inferbench-backend", "sim-server",
                               "--inferbench-time-scale", "0")
    result.assert_outcomes(passed=1)
    served = only_record(project)
    assert served["power_valid"] == 0 and "avg_power_w" not in served
    assert "time scale 0" in str(served["power_invalid_reason"])


def test_at_another_time_scale_the_power_is_per_wall_second_as_the_duration_is(
        project: pytest.Pytester) -> None:
    scale = 0.5  # half a wall second per model second
    result = project.runpytest(*FLAGS, "--inferbench-backend", "sim-server",
                               "--inferbench-time-scale", f"{scale:g}")
    outcomes = result.parseoutcomes()  # a busy machine's self-check verdict is not judged
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == 1, outcomes
    served = only_record(project)
    assert_only_timing_verdicts(served)
    assert served["time_scale"] == scale and served["power_valid"] == 1
    deltas = served["server_metrics"]["counter_deltas"]
    joules, seconds = deltas[f"{ENERGY_COUNTER}_total"], deltas[f"{SECONDS_COUNTER}_total"]
    # The record's duration is wall seconds; the counters' seconds are the model's, each
    # `scale` wall seconds long: the mean power is per wall second, the model's / scale.
    watts = float(served["avg_power_w"])
    assert watts == pytest.approx(joules / (seconds * scale), abs=1e-3)
    assert MI355X.idle_w / scale < watts <= MI355X.tdp_w / scale
    assert float(served["total_gpu_energy_j"]) == pytest.approx(
        watts * 4 * float(served["duration"]), rel=1e-5)
    assert any(f"time scale {scale:g}: the simulated power is per wall-clock second" in note
               for note in served["notes"]), served["notes"]
