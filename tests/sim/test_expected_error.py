"""The expected error of simulated points: one packaged table, computed by the reference script
from the published points, and carried by every simulated point's record and table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pytest_inferbench.sim import expected_error

REPO = Path(__file__).resolve().parents[2]


def test_packaged_table_is_what_the_reference_script_computes(tmp_path: Path) -> None:
    out = tmp_path / "expected_error.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks/sim_reference.py"),
                           "--write", str(out)], capture_output=True, text=True, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == expected_error.packaged_json(), (
        "the packaged sim/expected_error.json is stale: regenerate it with "
        "`python benchmarks/sim_reference.py --write pytest_inferbench/sim/expected_error.json`")


def test_too_few_points_is_an_unknown_error_not_a_number() -> None:
    table = expected_error.figures({"calibrated family, small batch": {"ttft": [0.5]}})
    lone = table["calibrated family, small batch"]["ttft"]
    assert lone.points == 1 and lone.error is None
    unknown = expected_error.expected_error("multinode, high concurrency")
    assert all(unknown[m] is None for m in expected_error.METRICS)
    assert "no reference points: error unknown" in expected_error.label(unknown)
