"""The simulated HTTP server (`sim-server` backend) with `--inferbench-sim-calibration`: the
server prices with the file's knobs and its points name the calibration."""

from __future__ import annotations

import json

# In-process pytester runs drop modules first imported during a run; numpy cannot be imported
# twice in one process, and httpx (which imports httpcore on first use) maps httpcore's errors
# by class, so a second httpcore's errors would escape it: httpcore and the simulator are
# imported here, once.
import httpcore  # noqa: F401
import pytest
from calibration_project import NAMED, only_record, write_project

import pytest_inferbench.backends.sim  # noqa: F401


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return write_project(pytester)


def test_the_simulated_http_server_runs_with_the_calibration_and_its_points_name_it(
        project: pytest.Pytester) -> None:
    result = project.runpytest("-p", "no:cacheprovider", "--inferbench-no-plots",
                               "--inferbench-backend", "sim-server", "--inferbench-time-scale", "0",
                               "--inferbench-sim-calibration", "calib.yaml")
    result.assert_outcomes(passed=1)
    record = only_record(project)
    assert any(str(n).startswith(f"calibrated by {NAMED}")
               for n in record["notes"]), record["notes"]  # type: ignore[attr-defined]
    # The server itself priced with it: its banner says so, and no flag went unread.
    (log,) = (project.path / "inferbench-results" / "server-logs").glob("*.log")
    text = log.read_text()
    assert "inferbench-sim: calibrated by " in text and "step_overhead_ms 20" in text, text
    assert "'--calibration" not in text


@pytest.mark.parametrize("calibrated", [(), ("--inferbench-sim-calibration", "calib.yaml")],
                         ids=["profile", "calibrated"])
def test_simulated_http_server_points_carry_the_expected_error_of_in_process_ones(
        project: pytest.Pytester, calibrated: tuple[str, ...]) -> None:
    flags = ("-p", "no:cacheprovider", "--inferbench-no-plots", *calibrated)
    project.runpytest(*flags).assert_outcomes(passed=1)
    in_process = only_record(project)
    result = project.runpytest(*flags, "--inferbench-backend", "sim-server",
                               "--inferbench-time-scale", "0")
    result.assert_outcomes(passed=1)
    served = only_record(project)
    assert served["backend"] == "sim-server"
    expected, label = in_process["expected_error"], in_process["expected_error_label"]
    assert isinstance(expected, dict) and isinstance(label, str)
    assert served["expected_error"] == expected
    assert served["expected_error_label"] == label
    result.stdout.fnmatch_lines([f"*{label}*"])  # the point's table row shows it
    raw = json.loads((project.path / "inferbench-results" / "points"
                      / f"{served['result_filename']}.json").read_text())
    assert raw["inferbench"]["expected_error"] == expected
