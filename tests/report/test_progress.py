"""Progress for CI: a line per point at start and end, periodic lines with an ETA between."""

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


def test_ci_run_prints_a_line_at_each_points_start_and_end(pytester: pytest.Pytester) -> None:
    (pytester.path / "bench-master.yaml").write_text(
        master_entry(rows=["{ tp: 4, conc-list: [2, 4] }"], isl=256, osl=32))
    shutil.copytree(REPO / "benchmarks" / "launch", pytester.path / "launch")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-no-plots",
                                           "--inferbench-prompts-per-conc", "2",
                                           "--inferbench-progress", "lines")
    result.assert_outcomes(passed=2)
    node = "bench-master.yaml::minimaxm3-fp4-mi355x-atom-tp4::isl256-osl32"
    result.stdout.fnmatch_lines([
        f"inferbench: {node}-conc2: start, 4 requests at conc 2",
        f"inferbench: {node}-conc2: done, 4/4 requests in * s, passed",
        f"inferbench: {node}-conc4: start, 8 requests at conc 4",
        f"inferbench: {node}-conc4: done, 8/8 requests in * s, passed",
    ])
    quiet = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-no-plots",
                                          "--inferbench-prompts-per-conc", "2",
                                          "--inferbench-progress", "off")
    assert not [line for line in quiet.outlines if ": start, " in line]
