"""The calibration test project, one for the `sim` and the `sim-server` calibration tests: an
ATOM MiniMax-M3 entry at concurrency 1, its launch spec, and `calib.yaml`, a calibration file
with an entry for that server whose step overhead is far above the profile's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_inferbench.sim.calibrate import file as calibration_file
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[1]
ATOM = "minimaxm3-fp4-mi355x-atom"
OVERHEAD_MS = 20.0  # far above the profile's: every decode step costs at least this
NAMED = "calib.yaml (MI355X, atom, amd/MiniMax-M3-MXFP4; 3 points)"  # how the points name it

CALIBRATION = f"""\
format: {calibration_file.FORMAT}
version: {calibration_file.VERSION}
entries:
- hardware: MI355X
  framework: atom
  model: amd/MiniMax-M3-MXFP4
  knobs: {{step_overhead_ms: {OVERHEAD_MS:g}, hbm_efficiency: 0.8, compute_efficiency: 0.09}}
  points: 3
  error:
    leave_one_out: {{ttft: 0.12, tpot: 0.05, throughput: 0.06}}
"""


def write_project(pytester: pytest.Pytester) -> pytest.Pytester:
    """The project in `pytester.path`: `bench-master.yaml`, `launch/`, `calib.yaml`."""
    entry = master_entry(ATOM, ("{ tp: 4, conc-list: [1] }",), osl=64)
    (pytester.path / "bench-master.yaml").write_text(entry)
    (pytester.path / "launch").mkdir()
    shutil.copy(REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml",
                pytester.path / "launch")
    (pytester.path / "calib.yaml").write_text(CALIBRATION)
    return pytester


def only_record(project: pytest.Pytester) -> dict[str, object]:
    """The one point's record of the project's last run (`summary.json`)."""
    summary = json.loads((project.path / "inferbench-results" / "summary.json").read_text())
    (point,) = summary["points"]
    assert isinstance(point, dict)
    return point
