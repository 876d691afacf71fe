"""Calibration from measurements: `python -m pytest_inferbench.sim calibrate` on a published
sweep (CSV), the fit recovering knobs from points made with them, and bad input."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.calibrate import file as calibration_file
from pytest_inferbench.sim.calibrate.cli import run
from pytest_inferbench.sim.calibrate.fit import errors, fit, predict, profile_of
from pytest_inferbench.sim.calibrate.knobs import KNOBS, to_values
from pytest_inferbench.sim.calibrate.points import MeasuredPoint, read_csv
from pytest_inferbench.sim.efficiency import Efficiency
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]
SWEEP = Path(__file__).parent / "data" / "atom_minimax_m3_sweep.csv"
# The 4 measured values the calibration sees: both ends of the sweep, decode and throughput at
# the top, decode and TTFT at the bottom.
FITTED = {(4, "ttft"), (4, "tpot"), (64, "tpot"), (64, "throughput")}


def _rows(path: Path) -> tuple[list[str], list[str]]:
    lines = path.read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("server,"))
    return lines[:header + 1], lines[header + 1:]


def _conc_metric(row: str) -> tuple[int, str]:
    cells = row.rsplit('"', 1)[1].split(",")
    return int(cells[4]), cells[5]


def test_four_points_of_the_published_sweep_predict_its_other_points(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    head, rows = _rows(SWEEP)
    fitted_rows = [r for r in rows if _conc_metric(r) in FITTED]
    assert len(fitted_rows) == 4
    measurements = tmp_path / "four.csv"
    measurements.write_text("\n".join(head + fitted_rows) + "\n")
    out = tmp_path / "calib.yaml"
    assert run([str(measurements), "-o", str(out)]) == 0
    report = capsys.readouterr().out
    assert "median |error| leave-one-out: TTFT" in report
    (entry,) = calibration_file.load(out).entries
    assert entry.points == 2 and len(entry.sources) == 2  # conc 4 and conc 64
    # The fit lowers the error where it was fitted, and the leave-one-out figures are there.
    fitted_err, before = entry.errors("fitted"), entry.errors("uncalibrated")
    loo = entry.errors("leave_one_out")
    for metric in ("ttft", "tpot", "throughput"):
        assert fitted_err[metric] is not None and before[metric] is not None
        assert fitted_err[metric] <= before[metric]
        assert loo[metric] is not None
    # The sweep's other 11 values, predicted with the calibrated knobs.
    held_out = [p for p in read_csv(SWEEP) if p.conc not in (4, 64)]
    misses = []
    for point in read_csv(SWEEP):
        err = errors(point, predict(point, entry.efficiency))
        misses += [abs(e) for m, e in err.items() if (point.conc, m) not in FITTED]
    assert len(misses) == 11 and held_out
    assert float(np.median(misses)) <= 0.10, misses


def test_the_fit_recovers_the_knobs_its_measurements_were_made_with() -> None:
    """Measurements made by the simulator itself with knobs far from the profile's (a slower
    host, a weaker HBM stack, young GEMM kernels): the fit from the profile finds them, and
    points it did not see come out as they were made."""
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "openai/gpt-oss-120b",
            "--tp", "8"]
    config, _ = engine_config_from_argv(argv, hardware="B200")

    def point(isl: int, osl: int, conc: int) -> MeasuredPoint:
        return MeasuredPoint("made", config, (), isl, osl, conc, 4 * conc, 1.0,
                             (("ttft", 1.0), ("tpot", 1.0), ("throughput", 1.0)))

    profile = profile_of(point(1024, 1024, 1))
    truth = Efficiency(step_overhead_s=profile.step_overhead_s * 0.5,
                       hbm_efficiency=profile.hbm_efficiency * 0.7,
                       compute_efficiency=profile.compute_efficiency * 0.4)

    def measured(p: MeasuredPoint) -> MeasuredPoint:
        made = predict(p, truth)
        return MeasuredPoint(p.source, p.config, (), p.isl, p.osl, p.conc, p.prompts,
                             p.range_ratio, tuple((m, made[m]) for m, _ in p.values))

    seen = [measured(point(1024, 1024, 1)), measured(point(1024, 1024, 32)),
            measured(point(8192, 1024, 4)), measured(point(8192, 1024, 16))]
    result = fit(seen, profile)
    got, want, start = (to_values(e) for e in (result.efficiency, truth, profile))
    for knob in KNOBS:
        assert got[knob.name] == pytest.approx(want[knob.name], rel=0.05), knob.name
        assert abs(start[knob.name] / want[knob.name] - 1) > 0.25  # it had to move
    for unseen in (measured(point(1024, 1024, 8)), measured(point(8192, 1024, 8))):
        assert all(abs(e) < 0.02 for e in errors(unseen, predict(unseen, result.efficiency))
                   .values())


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = run(args)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("text", "says"), [
    ("server,hardware,isl,osl,conc,metric\n", "missing column value"),
    ("server,hardware,isl,osl,conc,metric,value,color\n", "unknown column color"),
    ("server,hardware,isl,osl,conc,metric,value\n"
     "vllm serve openai/gpt-oss-120b,H100,1024,1024,4,latency,3\n", ":2: unknown metric 'latency'"),
    ("# a comment\nserver,hardware,isl,osl,conc,metric,value\n"
     "vllm serve openai/gpt-oss-120b,H100,1024,1024,four,tpot,3\n",
     ":3: conc must be a whole number, got 'four'"),
    ("server,hardware,isl,osl,conc,metric,value\n"
     "vllm serve no/such-model,H100,1024,1024,4,tpot,3\n",
     ":2: the simulator cannot read this server"),
    ("server,hardware,isl,osl,conc,metric,value\n"
     "vllm serve openai/gpt-oss-120b,H100,1024,1024,4,tpot,-3\n",
     ":2: value must be a positive number"),
])
def test_bad_measurements_name_the_file_and_line(tmp_path: Path, text: str, says: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "points.csv"
    bad.write_text(text)
    code, err = _cli(capsys, str(bad), "-o", str(tmp_path / "c.yaml"))
    assert code == 2
    assert f"calibrate: error: {bad}" in err and says in err, err
    assert not (tmp_path / "c.yaml").exists()


def test_the_command_says_what_is_wrong_without_a_traceback(tmp_path: Path) -> None:
    """The module entry point, as a user runs it: a missing input and a file that is not a
    calibration in the way of the output."""
    precious = tmp_path / "notes.yaml"
    precious.write_text("shopping: [milk]\n")
    for args, says in (([str(tmp_path / "nowhere.csv")], "no such file or directory"),
                       ([str(SWEEP), "-o", str(precious)], "not overwritten")):
        done = subprocess.run(
            [sys.executable, "-m", "pytest_inferbench.sim", "calibrate", *args],
            capture_output=True, text=True, check=False, timeout=120)
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert precious.read_text() == "shopping: [milk]\n"


def test_csv_rows_may_name_a_recipe_server_node_instead_of_an_argv(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = "minimaxm3-fp4-mi355x-atom"
    (tmp_path / "bench-master.yaml").write_text(
        master_entry(key, ("{ tp: 4, conc-list: [4, 64] }",), isl=8192, osl=1024))
    (tmp_path / "launch").mkdir()
    shutil.copy(REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml", tmp_path / "launch")
    points = tmp_path / "points.csv"
    points.write_text("server,hardware,isl,osl,conc,metric,value\n"
                      f"{key}-tp4,,8192,1024,4,tpot,7.5\n"  # the node name; its hardware
                      f"{key},MI355X,8192,1024,64,throughput,2433\n")  # its only node's key
    out = tmp_path / "c.yaml"
    recipe = str(tmp_path / "bench-master.yaml")
    assert run([str(points), "--recipe", recipe, "-o", str(out)]) == 0
    (entry,) = calibration_file.load(out).entries
    assert entry.key == ("MI355X", "atom", "amd/MiniMax-M3-MXFP4") and entry.points == 2
    points.write_text("server,hardware,isl,osl,conc,metric,value\n"
                      "no-such-node,,8192,1024,4,tpot,7.5\n")
    capsys.readouterr()
    assert run([str(points), "--recipe", recipe, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{points}:2: no server node 'no-such-node' in the recipes; known: {key}" in err, err


def test_a_reader_that_stops_early_loses_no_fit_and_sees_no_traceback(tmp_path: Path) -> None:
    """`calibrate ... | head -0`: the pipe is closed before the report is printed."""
    out = tmp_path / "calib.yaml"
    command = subprocess.Popen(
        [sys.executable, "-m", "pytest_inferbench.sim", "calibrate", str(SWEEP), "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert command.stdout is not None and command.stderr is not None
    command.stdout.close()
    stderr = command.stderr.read().decode()
    command.wait(timeout=120)
    assert "Traceback" not in stderr, stderr
    assert calibration_file.load(out).entries
