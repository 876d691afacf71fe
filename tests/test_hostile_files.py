"""Hostile file names and full disks: every point keeps files of its own, under a name a file
system takes, and a write that fails fails cleanly.

- Python benchmarks whose names meet (the same class and test names in two classes or modules,
  parametrize ids that read the same once made file-safe, a test whose second call reads as
  another test's first), recipe entries InferenceX would give one RESULT_FILENAME, and a
  parametrize id too long for a file name: each point's files hold that point, as many files
  as the summary counts points, every name within a file system's 255 bytes.
- A full disk: a real one (a 64 KiB tmpfs, filled once the tests start; needs root) and a file
  size limit of 0 bytes (`RLIMIT_FSIZE`, any user: `write` fails with EFBIG as it fails with
  ENOSPC on a full disk). A point whose files cannot be written fails naming the file; the run
  still prints its tables and summary line, leaves no temporary file, and a run-level file
  (summary.json, the saved baseline) that cannot be written is one error line naming it.
- Server logs: each xdist worker's start of a server writes a log of its own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[1]
KEY = "minimaxm3-fp4-mi355x-atom"
NAME_MAX = 255  # bytes of one file name on Linux file systems
# A pytest run in its own process, without the plugins of this environment it does not need.
PYTEST = ("python3", "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:benchmark",
          "-p", "no:hypothesispytest")

NAMED_TESTS = f'''
import pytest

MARK = pytest.mark.inferbench_server("{KEY}", tp=4)


@MARK
class TestA:
    def test_load(self, inferbench_load):
        inferbench_load(isl=64, osl=8, conc=1)


@MARK
class TestB:
    def test_load(self, inferbench_load):
        inferbench_load(isl=64, osl=8, conc=1)


@MARK
def test_twice(inferbench_load):
    inferbench_load(isl=64, osl=8, conc=1)
    inferbench_load(isl=64, osl=8, conc=1)


@MARK
def test_twice_2(inferbench_load):
    inferbench_load(isl=64, osl=8, conc=1)


@MARK
@pytest.mark.parametrize("label", ["a b", "a-b", "a/b"])
def test_ids(inferbench_load, label):
    inferbench_load(isl=64, osl=8, conc=1)


@MARK
@pytest.mark.parametrize("label", ["x" * 400])
def test_long(inferbench_load, label):
    inferbench_load(isl=64, osl=8, conc=1)
'''

OTHER_MODULE = f'''
import pytest


@pytest.mark.inferbench_server("{KEY}", tp=4)
class TestA:
    def test_load(self, inferbench_load):
        inferbench_load(isl=64, osl=8, conc=1)
'''

# (case, the nodeids of its tests start with one of these, how many points they ran)
NAME_CASES: list[tuple[str, tuple[str, ...], int]] = [
    ("same test name in two classes", ("test_named.py::TestA::", "test_named.py::TestB::"), 2),
    ("same class and test in two modules", ("test_named.py::TestA::", "test_other.py::TestA::"),
     2),
    ("two calls with the same arguments, and a test named like the second call",
     ("test_named.py::test_twice",), 3),
    ("parametrize ids that read the same once file-safe", ("test_named.py::test_ids[",), 3),
    ("a parametrize id longer than a file name", ("test_named.py::test_long[",), 1),
    ("two recipe entries with one RESULT_FILENAME", ("bench-master.yaml::",), 3),
]


def _project(root: Path) -> None:
    (root / "bench-master.yaml").write_text(
        master_entry(f"{KEY}-a", rows=["{ tp: 4, conc-list: [1, 2] }"], isl=64, osl=8)
        + master_entry(f"{KEY}-b", isl=64, osl=8, image="rocm/atom-dev:other"))
    (root / "launch").mkdir()
    shutil.copy(REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml", root / "launch")


def _clean(text: str) -> str:
    assert "Traceback" not in text and "INTERNALERROR" not in text, text
    assert "Exception in thread" not in text and "Unhandled" not in text, text
    return text


@pytest.fixture(scope="module")
def named_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of every naming case (a pytest run costs seconds): its summary and its files."""
    root = tmp_path_factory.mktemp("names")
    _project(root)
    # Both recipe entries name one server key: the marker picks the first by its config key.
    (root / "test_named.py").write_text(NAMED_TESTS.replace(f'"{KEY}"', f'"{KEY}-a"'))
    (root / "test_other.py").write_text(OTHER_MODULE.replace(f'"{KEY}"', f'"{KEY}-a"'))
    done = subprocess.run(
        [*PYTEST, "--inferbench-no-plots",
         "--inferbench-prompts-per-conc", "1", "--inferbench-save-requests"],
        cwd=root, capture_output=True, text=True, check=False, timeout=300)
    text = _clean(done.stdout + done.stderr)
    results = root / "inferbench-results"
    return {"summary": json.loads((results / "summary.json").read_text()),
            "results": results, "text": text}


@pytest.mark.parametrize("case, prefixes, count", NAME_CASES,
                         ids=[case for case, _, _ in NAME_CASES])
def test_every_point_keeps_files_of_its_own(named_run: dict[str, Any], case: str,
                                            prefixes: tuple[str, ...], count: int) -> None:
    points = [p for p in named_run["summary"]["points"] if p["nodeid"].startswith(prefixes)]
    assert len(points) == count, (case, [p["nodeid"] for p in points])
    assert all(p["verdict"] == "passed" for p in points), (case, named_run["text"])
    names = [p["result_filename"] for p in points]
    assert len(set(names)) == count, (case, names)
    results: Path = named_run["results"]
    for point in points:
        name = point["result_filename"]
        raw = json.loads((results / "points" / f"{name}.json").read_text())
        # The file holds this point, not one written over it (a Python test's summary rows
        # are numbered after its nodeid).
        assert point["nodeid"].startswith(raw["inferbench"]["nodeid"]), (case, name)
        assert raw["inferbench"]["result_filename"] == name
        assert (results / "requests" / f"{name}.jsonl").is_file()


def test_files_are_as_many_as_points_and_every_name_fits(named_run: dict[str, Any]) -> None:
    results: Path = named_run["results"]
    points = named_run["summary"]["points"]
    raw = [p for p in (results / "points").iterdir() if not p.name.startswith("agg_")]
    assert len(raw) == len(points)
    assert all(len(p.name.encode()) <= NAME_MAX for p in results.rglob("*"))
    # A too-long name keeps its readable start.
    long = [p for p in points if "test_long[" in p["nodeid"]]
    assert long and long[0]["result_filename"].startswith(f"{long[0]['exp_name']}_fp4_atom_")
    assert "xxxxxxxxxx" in long[0]["result_filename"]


def test_a_recipe_point_no_other_point_shares_a_name_with_keeps_inferencex_s(
        named_run: dict[str, Any]) -> None:
    [alone] = [p for p in named_run["summary"]["points"]
               if p["nodeid"].startswith("bench-master.yaml::") and p["conc"] == 2]
    assert alone["result_filename"] == (f"{alone['exp_name']}_fp4_atom_tp4-pp1-dcp1-pcp1-ep1-"
                                        "dpafalse_disagg-false_spec-none_conc2_mi355x")


# ---------------------------------------------------------------------------- full disks

FILL_CONFTEST = '''
import errno
import os
import resource

import pytest


def fill():
    """Make every write of a file fail from now on, as a full disk does."""
    how, _, where = os.environ["FILL_DISK"].partition(":")
    if how == "fsize":  # write(2) fails with EFBIG (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
        return
    try:
        with open(os.path.join(where, "filler"), "wb", buffering=0) as out:
            while True:
                out.write(b"x" * 4096)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise


if os.environ.get("FILL_AT") == "start":
    def pytest_sessionstart(session):
        fill()
elif os.environ.get("FILL_AT") == "tests":
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(session):
        fill()
else:
    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(session):
        fill()
        return (yield)
'''


def _mount_tmpfs(disk: Path) -> bool:
    if os.geteuid() != 0:  # mounting needs root
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                          capture_output=True, check=False).returncode == 0


@pytest.fixture
def full_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(FILL_DISK's value, a directory on the disk to fill): a 64 KiB tmpfs where this user
    may mount one, else an ordinary directory and the run's file size limit (one kind a run:
    each run of pytest costs seconds)."""
    disk = tmp_path_factory.mktemp("disk")
    if not _mount_tmpfs(disk):
        yield "fsize", disk
        return
    try:
        yield f"tmpfs:{disk}", disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _full_run(root: Path, fill: str, at: str, *args: str) -> tuple[int, str]:
    """A run of two points whose disk fills at `at` (`start`: as the session starts; `tests`:
    before the first test; `end`: as the session finishes); its exit status and output. A
    subprocess with pipes: a file size limit would hold its output too if that went to a
    file, as pytester's does."""
    _project(root)
    (root / "bench-master.yaml").write_text(
        master_entry(KEY, rows=["{ tp: 4, conc-list: [1, 2] }"], isl=64, osl=8))
    (root / "conftest.py").write_text(FILL_CONFTEST)
    done = subprocess.run(
        [*PYTEST, "--inferbench-prompts-per-conc", "1", *args],
        cwd=root, capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "FILL_DISK": fill, "FILL_AT": at})
    return done.returncode, _clean(done.stdout + done.stderr)


# The figures of a run are drawn where matplotlib (the `plot` extra) is installed.
PLOTS: tuple[str, ...] = (() if importlib.util.find_spec("matplotlib") is not None
                          else ("--inferbench-no-plots",))


def _temp_files(*dirs: Path) -> list[Path]:
    return [p for d in dirs if d.exists() for p in d.rglob("*") if p.name.endswith(".tmp")]


def test_points_on_a_full_disk_fail_naming_their_file(
        tmp_path: Path, full_disk: tuple[str, Path]) -> None:
    fill, disk = full_disk
    results = disk / "results"
    # Over HTTP: the server's log file is on the full disk too.
    status, text = _full_run(tmp_path, fill, "tests", f"--inferbench-results={results}",
                             "--inferbench-save-requests", "--inferbench-backend", "sim-server",
                             "--inferbench-time-scale", "0", *PLOTS)
    assert status == pytest.ExitCode.TESTS_FAILED, text
    raw_dir = results / "points"
    for conc in (1, 2):
        # The point's failure names the file it could not write, and why.
        assert f"cannot write {raw_dir}/" in text and f"_conc{conc}_" in text, text
    assert ("No space left on device" if fill.startswith("tmpfs") else "File too large") in text
    # The run still reports: the node's table, the run-level file it could not write, the
    # summary line.
    assert "inferbench results" in text and "2 failed" in text.splitlines()[-1], text
    assert f"inferbench: error: cannot write {results / 'summary.json'}:" in text, text
    assert _temp_files(results) == []
    if PLOTS == ():  # drawn: none written, and no half-written figure left
        assert f"inferbench: error: cannot write {results / 'plots'}" in text, text
        assert list((results / "plots").iterdir()) == []


def test_a_baseline_that_cannot_be_saved_is_one_error_line(
        tmp_path: Path, full_disk: tuple[str, Path]) -> None:
    fill, disk = full_disk
    baseline = disk / "baseline.json"
    status, text = _full_run(tmp_path, fill, "end", f"--inferbench-save-baseline={baseline}",
                             "--inferbench-no-plots")
    # Every test passed, but the run did not leave what it was asked for.
    assert status == pytest.ExitCode.USAGE_ERROR, text
    lines = [line for line in text.splitlines() if str(baseline) in line]
    assert len(lines) == 1 and lines[0].startswith(
        f"inferbench: error: cannot write {baseline}: "), text
    assert "inferbench results" in text and "2 passed" in text.splitlines()[-1], text
    assert not baseline.exists() and _temp_files(disk, tmp_path / "inferbench-results") == []


def test_a_results_directory_on_a_full_disk_is_a_usage_error(
        tmp_path: Path, full_disk: tuple[str, Path]) -> None:
    fill, disk = full_disk
    results = disk / "results"
    status, text = _full_run(tmp_path, fill, "start", f"--inferbench-results={results}",
                             "--inferbench-no-plots")
    assert status == pytest.ExitCode.USAGE_ERROR, text
    assert f"inferbench: cannot write {results / 'run.json'}: " in text, text
    assert "passed" not in text and "failed" not in text, text
    # Nothing half-written that would make the next run refuse the directory as no run's.
    assert not (results / "run.json").exists()


# ---------------------------------------------------------------------------- server logs


@pytest.mark.parametrize("node", ["minimaxm3-fp4-mi355x-atom-tp4", "dsr1.v3-tp8", "n" * 300],
                         ids=["plain", "a dot in the name", "longer than a file name"])
def test_each_xdist_worker_writes_its_own_server_log(tmp_path: Path, node: str) -> None:
    from pytest_inferbench.backends.readiness import log_path_for

    paths = [log_path_for(tmp_path, node, worker, set()) for worker in ("gw0", "gw1", "master")]
    assert len(set(paths)) == len(paths), paths
    assert all(len(p.name.encode()) <= NAME_MAX and p.suffix == ".log" for p in paths), paths
    # The slurm backend names its image import's log beside the server's.
    assert len({p.with_suffix(".enroot.log") for p in paths}) == len(paths)
    if len(node) < 100:
        assert paths[0].name == f"{node}.gw0.log" and paths[2].name == f"{node}.log"


def test_a_server_log_that_cannot_be_written_still_drains_the_server_s_output(
        tmp_path: Path) -> None:
    from pytest_inferbench.backends.readiness import LogPump
    from pytest_inferbench.results.redact import Redactor

    (tmp_path / "a-file").write_text("not a directory\n")
    path = tmp_path / "a-file" / "server.log"  # its folder cannot be made
    read: list[int] = []

    def output() -> Iterator[bytes]:
        for index in range(1000):  # more than a pipe holds: a pump that stopped would stall it
            read.append(index)
            yield f"line {index} of the server's output\n".encode()

    pump = LogPump(output(), path, Redactor.from_env(()))
    pump.join(timeout_s=60)
    assert len(read) == 1000
    # What a failed start or a dead server shows: why the file is missing, then the last lines.
    note, *lines = pump.tail(2).splitlines()
    assert note.startswith(f"[inferbench] cannot write the server log {path}: "), note
    assert lines == ["line 998 of the server's output", "line 999 of the server's output"]
