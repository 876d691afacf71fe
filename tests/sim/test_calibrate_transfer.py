"""Calibration on a published sweep the simulator's constants were not fitted to: ATOM's
GLM-5.2 table on 8 x MI355X (tests/sim/data/atom_glm52_sweep.csv). Calibrating on 4 measured
values of the short-prompt end of the sweep predicts the rest of it, long prompts included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pytest_inferbench.sim.calibrate import file as calibration_file
from pytest_inferbench.sim.calibrate.cli import run
from pytest_inferbench.sim.calibrate.fit import errors, predict
from pytest_inferbench.sim.calibrate.points import read_csv

SWEEP = Path(__file__).parent / "data" / "atom_glm52_sweep.csv"
# What the calibration sees: TPOT and throughput at both ends of the 1024-token-prompt sweep
# (conc 1 and conc 64). Everything at 8192-token prompts and at conc 16 is predicted.
SEEN = {(1024, 1), (1024, 64)}


def test_four_values_of_a_sweep_not_fitted_on_predict_its_other_values(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = SWEEP.read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("server,"))
    points = read_csv(SWEEP)
    assert len(points) == 6  # 2 prompt lengths x 3 concurrencies, TPOT and throughput each
    seen_rows = [row for row in lines[header + 1:]
                 if (int(row.split(",")[2]), int(row.split(",")[4])) in SEEN]
    assert len(seen_rows) == 4
    measurements = tmp_path / "four.csv"
    measurements.write_text("\n".join(lines[:header + 1] + seen_rows) + "\n")
    out = tmp_path / "calib.yaml"
    assert run([str(measurements), "-o", str(out)]) == 0
    assert "leave-one-out" in capsys.readouterr().out
    (entry,) = calibration_file.load(out).entries
    held_out = [p for p in points if (p.isl, p.conc) not in SEEN]
    calibrated = [abs(e) for p in held_out
                  for e in errors(p, predict(p, entry.efficiency)).values()]
    uncalibrated = [abs(e) for p in held_out for e in errors(p, predict(p, None)).values()]
    assert len(calibrated) == 8
    # The profile alone misses these points by far more; the four values fix that.
    assert float(np.median(uncalibrated)) > 0.2, uncalibrated
    assert float(np.median(calibrated)) <= 0.10, calibrated
