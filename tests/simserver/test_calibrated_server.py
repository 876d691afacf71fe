"""The simulated HTTP server (`sim-server` backend) with `--inferbench-sim-calibration`: the
server prices with the file's knobs and its points name the calibration."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]
ATOM = "minimaxm3-fp4-mi355x-atom"
CALIBRATION = """\
format: pytest-inferbench sim calibration
version: 1
entries:
- hardware: MI355X
  framework: atom
  model: amd/MiniMax-M3-MXFP4
  knobs: {step_overhead_ms: 20, hbm_efficiency: 0.8, compute_efficiency: 0.09}
  points: 3
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    entry = master_entry(ATOM, ("{ tp: 4, conc-list: [1] }",), osl=64)
    (pytester.path / "bench-master.yaml").write_text(entry)
    (pytester.path / "launch").mkdir()
    shutil.copy(REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml",
                pytester.path / "launch")
    (pytester.path / "calib.yaml").write_text(CALIBRATION)
    return pytester


def _record(project: pytest.Pytester) -> dict[str, object]:
    summary = json.loads((project.path / "inferbench-results" / "summary.json").read_text())
    (point,) = summary["points"]
    assert isinstance(point, dict)
    return point


def test_the_simulated_http_server_runs_with_the_calibration_and_its_points_name_it(
        project: pytest.Pytester) -> None:
    result = project.runpytest("-p", "no:cacheprovider", "--inferbench-no-plots",
                               "--inferbench-backend", "sim-server", "--inferbench-time-scale", "0",
                               "--inferbench-sim-calibration", "calib.yaml")
    result.assert_outcomes(passed=1)
    record = _record(project)
    assert any(str(n).startswith("calibrated by calib.yaml (MI355X, atom, amd/MiniMax-M3-MXFP4")
               for n in record["notes"]), record["notes"]  # type: ignore[attr-defined]
    # The server itself priced with it: its banner says so, and no flag went unread.
    (log,) = (project.path / "inferbench-results" / "server-logs").glob("*.log")
    text = log.read_text()
    assert "inferbench-sim: calibrated by " in text and "step_overhead_ms 20" in text, text
    assert "'--calibration" not in text
