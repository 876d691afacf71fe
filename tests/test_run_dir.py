"""The results directory belongs to one run: an earlier run's results are moved aside, never
mixed; temp files of a killed writer are removed; every result carries the run id; a baseline
that mixes runs is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_inferbench.results import run_dir
from pytest_inferbench.testing.recipes import master_entry

RECIPE = master_entry(rows=["{ tp: 4, conc-list: [1, 2] }"], isl=256, osl=16)


def _raw_points(results: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted((results / "points").glob("*.json"))
            if not p.name.startswith("agg_")]


def test_a_rerun_moves_the_earlier_results_aside(pytester: pytest.Pytester) -> None:
    (pytester.path / "bench-master.yaml").write_text(RECIPE)
    results = pytester.path / "inferbench-results"
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)
    first_id = json.loads((results / "run.json").read_text())["run_id"]
    assert {p["inferbench"]["run_id"] for p in _raw_points(results)} == {first_id}  # type: ignore[index]
    # A writer killed mid-write left this (its pid is long gone).
    stale = results / "points" / ".x.json.999999999.abc123.tmp"
    stale.write_text("{")
    second = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "conc2")
    second.assert_outcomes(passed=1)
    aside = pytester.path / f"inferbench-results.{first_id}"
    second.stdout.fnmatch_lines(["inferbench: removed 1 temporary file(s)*",
                                 f"inferbench: *inferbench-results held the results of run "
                                 f"{first_id}: moved aside to *inferbench-results.{first_id}*"])
    second_id = json.loads((results / "run.json").read_text())["run_id"]
    assert second_id != first_id
    points = _raw_points(results)
    assert [p["max_concurrency"] for p in points] == [2]  # the subset only, never mixed
    assert {p["inferbench"]["run_id"] for p in points} == {second_id}  # type: ignore[index]
    assert len(_raw_points(aside)) == 2 and not list(aside.rglob("*.tmp"))
    summary = json.loads((results / "summary.json").read_text())
    assert summary["metadata"]["run_id"] == second_id
    # Two runs' point files in one directory are not one baseline.
    mixed = pytester.path / "mixed"
    shutil.copytree(results / "points", mixed)
    for raw in (aside / "points").glob("*conc1*"):
        shutil.copy(raw, mixed / raw.name)
    refused = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                            "--inferbench-baseline=mixed")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*baseline */mixed mixes the results of 2 runs*"])
    assert "Traceback" not in refused.stdout.str() + refused.stderr.str()


def _no_traceback(result: pytest.RunResult) -> None:
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text, text


REFUSED = "*inferbench: *pass an empty or new directory to --inferbench-results*"


@pytest.mark.parametrize(("where", "said"), [
    (".", REFUSED), ("{here}", REFUSED), ("bench", REFUSED), ("bench/../bench", REFUSED),
    ("a-file", "*--inferbench-results a-file: exists and is not a directory*")])
def test_a_directory_the_plugin_did_not_make_is_refused_and_left_as_it_was(
        pytester: pytest.Pytester, where: str, said: str) -> None:
    # The project, a recipe folder or a file as the results directory: moving it aside, as
    # an earlier run's results are, would move what the user owns.
    bench = pytester.mkdir("bench")
    (bench / "bench-master.yaml").write_text(RECIPE)
    (pytester.path / "a-file").write_text("mine\n")
    before = sorted(str(p.relative_to(pytester.path)) for p in pytester.path.rglob("*"))
    option = where.format(here=pytester.path)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "bench",
                                           f"--inferbench-results={option}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([said])
    _no_traceback(result)
    after = sorted(str(p.relative_to(pytester.path)) for p in pytester.path.rglob("*"))
    # pytest's own (the benchmark plugin's cache, pytester's basetemp) aside, all as it was
    pytests_own = (".benchmarks", "runpytest-", "stdout", "stderr")
    assert [p for p in after if not p.startswith(pytests_own)] == before


def test_a_second_run_on_a_live_runs_directory_refuses_and_the_first_completes(
        pytester: pytest.Pytester) -> None:
    (pytester.path / "bench-master.yaml").write_text(RECIPE)
    started, release = pytester.path / "started", pytester.path / "release"
    # The first run holds its directory while one of its tests waits for the second to end.
    pytester.makepyfile(test_wait=f"""
        import time
        from pathlib import Path

        def test_wait():
            Path({str(started)!r}).touch()
            deadline = time.monotonic() + 300
            while not Path({str(release)!r}).exists():
                assert time.monotonic() < deadline
                time.sleep(0.05)
        """)
    first = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider"],
                             cwd=pytester.path, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not started.exists():
            assert first.poll() is None, first.communicate()[0]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        first_id = json.loads((pytester.path / "inferbench-results" / "run.json")
                              .read_text())["run_id"]
        second = pytester.runpytest_subprocess("-p", "no:cacheprovider", "bench-master.yaml")
        assert second.ret == pytest.ExitCode.USAGE_ERROR
        second.stderr.fnmatch_lines([f"*inferbench-results is in use by run {first_id} (pid "
                                     f"{first.pid} on *"])
        _no_traceback(second)
    finally:
        release.touch()
        output = first.communicate(timeout=600)[0]
    assert first.returncode == 0, output
    results = pytester.path / "inferbench-results"
    assert json.loads((results / "run.json").read_text())["run_id"] == first_id
    points = _raw_points(results)
    assert len(points) == 2
    assert {p["inferbench"]["run_id"] for p in points} == {first_id}  # type: ignore[index]
    assert [p.name for p in pytester.path.iterdir() if p.name.startswith("inferbench-results")] \
        == ["inferbench-results"]  # nothing moved aside


def test_request_lines_a_killed_writer_left_are_removed_at_the_next_start(
        tmp_path: Path) -> None:
    # A real SIGKILL while the request lines are half written.
    target = tmp_path / "points" / "requests.jsonl"
    script = f"""
import os, signal
from pathlib import Path
from pytest_inferbench.results import point_files

def lines(records, mask):
    yield {{"request": 1}}
    os.kill(os.getpid(), signal.SIGKILL)
    yield {{"request": 2}}

point_files.request_lines = lines
point_files._write_request_lines(Path({str(target)!r}), [], str)
"""
    killed = subprocess.run([sys.executable, "-c", script], check=False)
    assert killed.returncode == -9
    left = list(target.parent.iterdir())
    assert len(left) == 1 and left[0].name.endswith(".tmp") and not target.exists()
    assert run_dir.remove_stale_temp_files(tmp_path) == [
        f"removed 1 temporary file(s) left by a writer that was killed mid-write in {tmp_path}"]
    assert not list(target.parent.iterdir())


def _run_once(results: Path, run_id: str, started: float, keep: int = run_dir.KEEP_RUNS
              ) -> list[str]:
    """One run's start (`prepare`) and end, its run.json dated `started`."""
    lines, lock = run_dir.prepare(results, run_id, (), keep=keep)
    (results / "points").mkdir()
    (results / "points" / "x.json").write_text("{}\n")
    os.utime(results / run_dir.RUN_FILE, (started, started))
    run_dir.release(lock)
    return lines


def test_only_the_newest_moved_aside_runs_are_kept_and_nothing_else_is_removed(
        tmp_path: Path) -> None:
    results = tmp_path / "inferbench-results"
    # Siblings the plugin did not make, each older than every run below: a name that is no run
    # id, a run id whose run.json names another run, one without run.json, and a link.
    decoys = {
        "inferbench-results.notes": {"run.json": '{"run_id": "notes"}'},
        "inferbench-results.0123456789ab": {"run.json": '{"run_id": "ba9876543210"}'},
        "inferbench-results.aaaaaaaaaaaa": {"data.csv": "mine\n"},
        "inferbench-results.bbbbbbbbbbbb-2": {"run.json": "not json"},
    }
    for name, files in decoys.items():
        (tmp_path / name).mkdir()
        for file, text in files.items():
            (tmp_path / name / file).write_text(text)
            os.utime(tmp_path / name / file, (1000, 1000))
    target = tmp_path / "linked"
    target.mkdir()
    (target / "run.json").write_text('{"run_id": "cccccccccccc"}')
    (tmp_path / "inferbench-results.cccccccccccc").symlink_to(target)
    run_ids = [f"{n:012x}" for n in range(1, 7)]
    said: list[str] = []
    for n, run_id in enumerate(run_ids):
        said += _run_once(results, run_id, started=2000 + n)
    kept = sorted(p.name for p in tmp_path.glob("inferbench-results.*")
                  if p.name not in decoys and not p.is_symlink())
    # The current run (the last) is in results; the three before it were moved aside and kept.
    assert kept == [f"inferbench-results.{i}" for i in run_ids[2:5]]
    assert all((tmp_path / name).is_dir() for name in decoys)
    assert (tmp_path / "inferbench-results.cccccccccccc").is_symlink() and target.is_dir()
    assert any(f"removed 1 earlier run(s) beside {results} (inferbench-results.{run_ids[0]})"
               in line for line in said)
    # keep=0: every moved-aside run goes, the decoys stay.
    _run_once(results, f"{7:012x}", started=3000, keep=0)
    assert sorted(p.name for p in tmp_path.glob("inferbench-results.*")) == sorted(
        [*decoys, "inferbench-results.cccccccccccc"])


def test_a_results_directory_is_ignored_by_git(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    results = tmp_path / "inferbench-results"
    _run_once(results, "0123456789ab", started=time.time())
    (tmp_path / "project.txt").write_text("tracked\n")
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                            cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert status.splitlines() == ["?? project.txt"]
    # The next run moves this one aside; the moved directory is still ignored.
    _run_once(results, "ba9876543210", started=time.time())
    assert (tmp_path / "inferbench-results.0123456789ab" / run_dir.GITIGNORE).is_file()
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                            cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert status.splitlines() == ["?? project.txt"]


def test_keep_runs_comes_from_the_ini_and_a_bad_value_is_refused(
        pytester: pytest.Pytester) -> None:
    (pytester.path / "bench-master.yaml").write_text(RECIPE)
    results = pytester.path / "inferbench-results"
    for n in range(3):  # two earlier runs moved aside, the third's results in place
        _run_once(results, f"{n + 1:012x}", started=1000 + n)
    pytester.makeini("[pytest]\ninferbench_keep_runs = 1\n")
    pytester.runpytest("-p", "no:cacheprovider", "-k", "conc1").assert_outcomes(passed=1)
    assert run_dir.moved_aside_runs(results) == [pytester.path / f"inferbench-results.{3:012x}"]
    pytester.makeini("[pytest]\ninferbench_keep_runs = some\n")
    refused = pytester.runpytest("-p", "no:cacheprovider", "-k", "conc1")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*inferbench_keep_runs = 'some': expected a whole number >= 0*"])
