"""Progress for CI: one line per point, periodic lines with an ETA while an HTTP point runs."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from pytest_inferbench.loadgen.progress import Progress
from pytest_inferbench.results.metrics import RequestRecord
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]


def test_periodic_lines_say_requests_done_rate_and_eta() -> None:
    lines: list[str] = []

    async def run() -> None:
        progress = Progress("node isl1-osl1-conc2", 4, emit=lines.append, interval_s=0.05)
        progress.start()
        await asyncio.sleep(0.08)  # one line before any request finished
        for _ in range(2):
            progress.on_record(RequestRecord(0.0, 1.0, 1, 1, True))
        await asyncio.sleep(0.06)
        await progress.stop()

    asyncio.run(run())
    assert len(lines) >= 2
    assert lines[0].startswith("node isl1-osl1-conc2: 0/4 requests") and "ETA ?" in lines[0]
    done = lines[-1]
    assert "2/4 requests" in done and " req/s" in done
    # Two requests left at the rate so far: ETA = 2 / (2 / elapsed) = elapsed.
    elapsed = float(done.split(" s, ")[0].split(", ")[-1])
    eta = float(done.split("ETA ")[1].removesuffix(" s"))
    assert eta == pytest.approx(elapsed, abs=1.0)


def test_a_terminal_gets_the_live_line_and_no_periodic_lines() -> None:
    class Tty:
        def __init__(self) -> None:
            self.text = ""

        def write(self, text: str) -> None:
            self.text += text

        def flush(self) -> None:
            pass

    tty, lines = Tty(), []

    async def run() -> None:
        progress = Progress("p", 2, tty, refresh_s=0.01, emit=lines.append, interval_s=0.01)
        progress.start()
        await asyncio.sleep(0.05)
        await progress.stop()

    asyncio.run(run())
    assert lines == [] and "p: 0/2 requests" in tty.text and "ETA ?" in tty.text


def test_a_ci_log_gets_one_line_per_point_with_simulated_and_wall_time(
        pytester: pytest.Pytester) -> None:
    # A second server without a launch spec: its point errors at setup and gets its line too.
    (pytester.path / "bench-master.yaml").write_text(
        master_entry(rows=["{ tp: 4, conc-list: [2, 4] }"], isl=256, osl=32)
        + master_entry("nospec-fp4-mi355x-atom", isl=256, osl=32, model_prefix="nospec"))
    (pytester.path / "test_plain.py").write_text("def test_a():\n    pass\n")
    shutil.copytree(REPO / "benchmarks" / "launch", pytester.path / "launch")
    common = ("-p", "no:cacheprovider", "--inferbench-no-plots", "--inferbench-prompts-per-conc",
              "2", "--inferbench-progress", "lines")
    result = pytester.runpytest(*common, "test_plain.py", "bench-master.yaml")
    result.assert_outcomes(passed=3, errors=1)
    node = "bench-master.yaml::minimaxm3-fp4-mi355x-atom-tp4::isl256-osl32"
    # Between the header and the next section: the plain test's letter, a line per point,
    # pytest's progress, nothing else (no file path written again before each point, no
    # start lines).
    body = result.outlines[result.outlines.index("inferbench: 2 server nodes, 3 benchmark "
                                                 "points") + 1:]
    body = [line.strip() for line in
            body[:next(n for n, line in enumerate(body) if line.startswith("=="))]]
    ours = [line for line in body if line.startswith("inferbench: bench-master.yaml::")]
    assert len(ours) == 3
    assert [line for line in body if line] == [".", *ours, "[100%]"]
    result.stdout.fnmatch_lines([
        f"inferbench: {node}-conc2: passed, 4/4 requests, simulated *.* s, wall *.* s",
        f"inferbench: {node}-conc4: passed, 8/8 requests, simulated *.* s, wall *.* s",
        "inferbench: bench-master.yaml::nospec-fp4-mi355x-atom-tp4::isl256-osl32-conc1: ERROR, "
        "*no launch spec for nospec-fp4-mi355x-atom*",
    ])
    # Under xdist the controller writes the lines, the error's reason as well.
    workers = pytester.runpytest(*common, "-p", "no:benchmark", "-n", "1", "bench-master.yaml",
                                 "-k", "conc1 or conc2")
    workers.assert_outcomes(passed=1, errors=1)
    for line in ("inferbench: *-conc1: ERROR, nospec-fp4-mi355x-atom-tp4: no launch spec for *",
                 f"inferbench: {node}-conc2: passed, 4/4 requests, simulated *.* s, wall *.* s"):
        workers.stdout.fnmatch_lines([line])  # in the order the worker ran them
    # -v keeps pytest's line per test; the point's line follows it.
    verbose = pytester.runpytest(*common, "-v", "bench-master.yaml", "-k", "not nospec")
    verbose.stdout.fnmatch_lines([f"{node}-conc2 PASSED*",
                                  f"inferbench: {node}-conc2: passed, 4/4 requests, *"])
    quiet = pytester.runpytest("-p", "no:cacheprovider", "--inferbench-no-plots",
                               "--inferbench-prompts-per-conc", "2", "--inferbench-progress", "off")
    assert not [line for line in quiet.outlines if "requests, simulated" in line]
