"""`--inferbench-sim-calibration FILE` (and the ini key) end to end: the simulator prices steps
with the file's knobs and every record and table names the calibration; result files of real
servers calibrate, simulated ones are refused; bad calibration files are clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from calibration_project import CALIBRATION, NAMED, OVERHEAD_MS, only_record, write_project

# In-process pytester runs drop modules first imported during a run; numpy cannot be imported
# twice in one process, so the simulator is imported here, once.
import pytest_inferbench.backends.sim  # noqa: F401
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.calibrate import file as calibration_file
from pytest_inferbench.sim.calibrate.cli import run

FLAGS = ("-p", "no:cacheprovider", "--inferbench-no-plots")


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return write_project(pytester)


def test_the_option_prices_with_the_calibration_and_records_and_tables_name_it(
        project: pytest.Pytester) -> None:
    project.runpytest(*FLAGS).assert_outcomes(passed=1)
    plain = only_record(project)
    assert not any("calibrat" in str(n) for n in plain["notes"])  # type: ignore[attr-defined]
    assert float(plain["mean_tpot_ms"]) < OVERHEAD_MS  # type: ignore[arg-type]

    result = project.runpytest(*FLAGS, "--inferbench-sim-calibration",
                               "calib.yaml")
    result.assert_outcomes(passed=1)
    calibrated = only_record(project)
    named = NAMED
    assert any(str(n).startswith(f"calibrated by {named}: step_overhead_ms 20")
               for n in calibrated["notes"]), calibrated["notes"]  # type: ignore[attr-defined]
    expected = calibrated["expected_error"]
    assert isinstance(expected, dict)
    assert expected["calibration"] == named and expected["tpot"] == 0.05
    label = calibrated["expected_error_label"]
    assert isinstance(label, str) and f"(calibrated by {named})" in label
    result.stdout.fnmatch_lines([f"*{label}*"])
    raw = json.loads((project.path / "inferbench-results" / "points"
                      / f"{calibrated['result_filename']}.json").read_text())
    assert raw["inferbench"]["expected_error"] == expected
    # Every decode step pays the calibrated overhead.
    assert float(calibrated["mean_tpot_ms"]) >= OVERHEAD_MS  # type: ignore[arg-type]



def test_the_ini_key_names_the_file_relative_to_the_rootdir(project: pytest.Pytester) -> None:
    from pytest_inferbench.options import Settings

    project.makeini("[pytest]\ninferbench_sim_calibration = calib.yaml\n")
    settings = Settings.from_config(project.parseconfigure())
    assert settings.sim_calibration == project.path / "calib.yaml"
    option = Settings.from_config(project.parseconfigure("--inferbench-sim-calibration",
                                                         "other.yaml"))
    assert option.sim_calibration == Path("other.yaml")  # the option wins, as given


def test_a_setup_the_file_has_no_entry_for_keeps_the_profile_and_says_so(
        tmp_path: Path) -> None:
    path = tmp_path / "calib.yaml"
    path.write_text(CALIBRATION.replace("MI355X", "MI300X"))
    calibration = calibration_file.load(path)
    argv = ["vllm", "serve", "amd/MiniMax-M3-MXFP4", "--tensor-parallel-size", "4"]
    config, _ = engine_config_from_argv(argv, hardware="MI355X")
    assert calibration.apply(config) == config
    assert calibration.note(config) == (
        f"sim calibration {path} has no entry for MI355X, vllm, amd/MiniMax-M3-MXFP4 (it has: "
        "MI300X, atom, amd/MiniMax-M3-MXFP4): the framework profile's knobs priced this point")


def test_results_of_real_servers_calibrate_and_simulated_ones_are_refused(
        project: pytest.Pytester, capsys: pytest.CaptureFixture[str]) -> None:
    project.runpytest(*FLAGS).assert_outcomes(passed=1)
    results = project.path / "inferbench-results"
    out = project.path / "fitted.yaml"
    capsys.readouterr()
    assert run([str(results), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "a simulated result (backend sim)" in err and "real servers" in err, err
    assert not out.exists()
    # The same point as a real server's record (what the process backend writes): its
    # server_argv is what the calibration simulates it with.
    (raw_path,) = (p for p in (results / "points").glob("*.json")
                   if not p.name.startswith("agg_"))
    raw = json.loads(raw_path.read_text())
    program = ["python3", "-m", "atom.entrypoints.openai_server"]
    assert raw["inferbench"]["server_argv"][:3] == program
    raw["inferbench"]["simulated"] = False
    raw["inferbench"]["backend"] = "process"
    raw_path.write_text(json.dumps(raw))
    assert run([str(results), "-o", str(out)]) == 0
    (entry,) = calibration_file.load(out).entries
    assert entry.key == ("MI355X", "atom", "amd/MiniMax-M3-MXFP4")
    assert entry.sources == (str(raw_path),) and entry.points == 1
    # Measured as the profile predicts it: nothing to correct.
    fitted = entry.errors("fitted")
    assert all(v is not None and v < 0.01 for v in fitted.values()), fitted


@pytest.mark.parametrize(("text", "line", "says"), [
    ("format: [unclosed\n", 2, "not YAML"),
    ("", 1, "empty"),
    ("format: something else\nversion: 1\nentries: []\n", 1, "not a calibration file"),
    (CALIBRATION.replace("version: 1", "version: 7"), 2, "version 7 not supported"),
    (CALIBRATION.replace("hbm_efficiency: 0.8", "hbm_efficiency: 3"), 7,
     "hbm_efficiency 3 is outside its bounds [0.2, 1]"),
    (CALIBRATION.replace("hbm_efficiency: 0.8", "hbm_speed: 0.8"), 7, "unknown knob 'hbm_speed'"),
    (CALIBRATION.replace("hardware: MI355X", "hardware: Z80"), 4, "Z80"),
    (CALIBRATION.replace("compute_efficiency: 0.09", "compute_efficiency: fast"), 7,
     "compute_efficiency must be a number, got str 'fast'"),
    (CALIBRATION + CALIBRATION.split("entries:\n")[1], 11, "a second entry for MI355X"),
])
def test_bad_calibration_files_name_the_file_and_line(tmp_path: Path, text: str, line: int,
                                                      says: str) -> None:
    path = tmp_path / "calib.yaml"
    path.write_text(text)
    with pytest.raises(calibration_file.CalibrationFileError) as caught:
        calibration_file.load(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}: ") and says in message, message


def test_a_bad_calibration_file_stops_the_run_before_any_server(
        project: pytest.Pytester) -> None:
    (project.path / "calib.yaml").write_text(
        CALIBRATION.replace("hbm_efficiency: 0.8", "hbm_efficiency: 3"))
    result = project.runpytest(*FLAGS, "--inferbench-sim-calibration",
                               "calib.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert "--inferbench-sim-calibration: calib.yaml:7: hbm_efficiency 3 is outside" in text
    assert "Traceback" not in text and "INTERNALERROR" not in text
    assert not (project.path / "inferbench-results" / "summary.json").exists()

