"""The expected error of simulated points: one packaged table, computed by the reference script
from the published points, and carried by every simulated point's record and table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# In-process pytester runs drop modules first imported during a run; numpy cannot be imported
# twice in one process, so the simulator is imported here, once.
import pytest_inferbench.backends.sim  # noqa: F401
from pytest_inferbench.report.tables import node_rows, terminal_tables
from pytest_inferbench.sim import expected_error
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]
ATOM = "minimaxm3-fp4-mi355x-atom"  # the calibration set's chip, framework and model
VLLM = "minimaxm3-fp4-mi355x-vllm"  # the same chip and model on an uncalibrated framework


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


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    recipe = "".join(master_entry(key, ("{ tp: 4, conc-list: [1] }",), osl=64, framework=fw)
                     for key, fw in ((ATOM, "atom"), (VLLM, "vllm")))
    (pytester.path / "bench-master.yaml").write_text(recipe)
    (pytester.path / "launch").mkdir()
    for name in ("minimaxm3_fp4_mi355x_atom.yaml", "minimaxm3_fp4_mi355x_vllm.yaml"):
        shutil.copy(REPO / "benchmarks/launch" / name, pytester.path / "launch")
    return pytester


def test_points_carry_their_regime_error_in_record_files_and_table(
        project: pytest.Pytester) -> None:
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    results = project.path / "inferbench-results"
    summary = json.loads((results / "summary.json").read_text())
    points = {p["server_node"].removesuffix("-tp4"): p for p in summary["points"]}
    batch = expected_error.batch_regime(1024, 64, 1)
    want = {ATOM: f"{expected_error.CALIBRATED}, {batch}",
            VLLM: f"{expected_error.UNCALIBRATED}, {batch}"}
    for key, regime in want.items():
        record = points[key]
        assert record["expected_error"] == expected_error.expected_error(regime)
        raw = json.loads((results / "points" / f"{record['result_filename']}.json").read_text())
        assert raw["inferbench"]["expected_error"] == record["expected_error"]
        label = expected_error.label(record["expected_error"])
        assert record["expected_error_label"] == label
        result.stdout.fnmatch_lines([f"  {label}"])
    assert points[ATOM]["expected_error"] != points[VLLM]["expected_error"]


def test_a_node_in_several_regimes_prints_each_with_its_points() -> None:
    small, heavy = (f"{expected_error.UNCALIBRATED}, {expected_error.batch_regime(8192, 1024, c)}"
                    for c in (1, 64))
    labels = {c: expected_error.label(expected_error.expected_error(r))
              for c, r in ((1, small), (64, heavy))}
    assert labels[1] != labels[64]
    rows = [{"server_node": "n", "isl": 8192, "osl": 1024, "conc": c, "simulated": True,
             "expected_error_label": labels[c], "verdict": "passed"} for c in (1, 64)]
    lines = terminal_tables(node_rows(rows))
    assert f"  {labels[1]}: 8192/1024 conc 1" in lines
    assert f"  {labels[64]}: 8192/1024 conc 64" in lines
