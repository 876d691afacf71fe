"""The simulated HTTP server (`sim-server` backend) with `--inferbench-sim-calibration`: the
server prices with the file's knobs and its points name the calibration."""

from __future__ import annotations

import pytest
from calibration_project import NAMED, only_record, write_project


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
