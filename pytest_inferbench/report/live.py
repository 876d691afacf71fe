"""Progress while points run: where the lines go, and one line per point in a log.

On a terminal the HTTP client's live line shows each point (`loadgen/progress.py`, with an
ETA). Without one (CI logs), or with `--inferbench-progress lines`, every point gets one line
when its report arrives, in place of pytest's progress letter and the file path pytest would
write again after it (`PointLines`, on the controller, so xdist runs get them too), and HTTP
points a line every `LINE_INTERVAL_S` while they run, written past pytest's output capture.
With `-v` pytest's own line per test stays and the point's line follows it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from ..loadgen.progress import ProgressOutput, terminal_stream

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ..results.record import Record

LINES_NAME = "inferbench-point-lines"
_XDIST_HEADER = re.compile(r"^\[gw\d+\] ")


def progress_output(config: pytest.Config, mode: str) -> ProgressOutput:
    """`auto`: the live line on a terminal, lines elsewhere; `lines`: lines; `off`: nothing."""
    if mode == "off" or hasattr(config, "workerinput"):
        return ProgressOutput()
    if mode == "auto" and (live := terminal_stream()) is not None:
        return ProgressOutput(live=live)
    return ProgressOutput(emit=_printer(config))


def _printer(config: pytest.Config) -> Callable[[str], None] | None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return None

    def say(text: str) -> None:
        if capture is None:
            reporter.write_line(f"inferbench: {text}")
            return
        with capture.global_and_fixture_disabled():  # the test's capture would swallow it
            reporter.write_line(f"inferbench: {text}")

    return say


def lines_wanted(config: pytest.Config, mode: str) -> bool:
    """Whether points get their lines: `lines`, or `auto` without a terminal."""
    return mode == "lines" or (mode == "auto" and terminal_stream() is None)


def register_lines(config: pytest.Config, mode: str,
                   results_of: Callable[[pytest.TestReport], Sequence[Record]]) -> None:
    """On the controller, once: one line per point (`PointLines`). `results_of`: the results
    a report carries (`report.report_results`)."""
    if (hasattr(config, "workerinput") or not lines_wanted(config, mode)
            or config.pluginmanager.has_plugin(LINES_NAME)):
        return
    config.pluginmanager.register(PointLines(config, results_of), LINES_NAME)


class PointLines:
    """A point's line when its report arrives: the outcome, the requests, and its time, with
    simulated time and wall time named apart (a simulated minute takes a fraction of a wall
    second). Without `-v` it stands in for pytest's letter, and pytest stops writing the file
    path (it would write it again after every line of ours)."""

    def __init__(self, config: pytest.Config,
                 results_of: Callable[[pytest.TestReport], Sequence[Record]]) -> None:
        self.config = config
        self.results_of = results_of
        self.verbose = config.get_verbosity() > 0
        self.mid_line = False  # pytest's letters of other tests are on the current line

    def _reporter(self) -> pytest.TerminalReporter | None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and not self.verbose:
            reporter.showfspath = False
        return reporter

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self) -> None:
        self._reporter()  # before the first test: pytest writes no file path from now on

    def _results(self, report: pytest.TestReport) -> Sequence[Record]:
        if report.when != "call" or report.outcome == "skipped" or hasattr(report, "wasxfail"):
            return []
        return self.results_of(report)

    @staticmethod
    def _unrun(report: pytest.TestReport) -> str | None:
        """A point that did not run (its server did not start, or it is skipped): its line."""
        if (report.when != "setup" or report.outcome == "passed"
                or "server_node" not in dict(report.user_properties)):
            return None
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
            return f"{report.nodeid}: skipped, {reason}".rstrip(", ")
        # The first line that says why (xdist puts "[gw0] linux -- Python ..." above it).
        first = next((line for line in report.longreprtext.splitlines()
                      if line.strip() and not _XDIST_HEADER.match(line)), "")
        return f"{report.nodeid}: ERROR, {first.strip()}".rstrip(", ")

    def _line_for(self, report: pytest.TestReport) -> bool:
        return bool(self._results(report)) or self._unrun(report) is not None

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport
                                 ) -> tuple[str, str, str] | None:
        if self.verbose or not self._line_for(report):
            return None
        category = "error" if report.when == "setup" and report.failed else report.outcome
        # No letter (the line says the rest); the word stays pytest's, as its short test
        # summary (`-rs`, `-rf`: "SKIPPED [3] ...", "FAILED <nodeid>") prints it.
        return category, "", category.upper()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        reporter = self._reporter()
        if reporter is None:
            return
        results, unrun = self._results(report), self._unrun(report)
        if not results and unrun is None:
            # pytest wrote a letter for a test of its own.
            shown = report.when == "call" or report.outcome != "passed"
            self.mid_line = self.mid_line or (shown and not self.verbose)
            return
        # pytest's "[100%]" counts the tests it wrote a letter for; this line stands for one.
        counted = getattr(reporter, "_progress_nodeids_reported", None)
        if isinstance(counted, set):
            counted.add(report.nodeid)
        if self.mid_line:
            reporter.line("")
            self.mid_line = False
        wall = report.duration if len(results) == 1 else None
        lines = [point_line(report.nodeid, result, wall, failed=report.failed)
                 for result in results] or [unrun or ""]
        for line in lines:
            reporter.write_line(f"inferbench: {line}")


def point_line(nodeid: str, result: Record, wall_s: float | None, *, failed: bool) -> str:
    """`<nodeid>: passed, 640/640 requests, simulated 294.0 s, wall 0.4 s`."""
    failures = result.get("gate_failures")
    count = len(failures) if isinstance(failures, list) else 0
    verdict = (f"FAILED ({count} reason{'s' if count != 1 else ''})" if count
               else "FAILED" if failed else "passed")
    done = f"{result.get('completed')}/{result.get('num_prompts')} requests"
    took = result.get("duration")
    times = []
    if isinstance(took, (int, float)):
        times.append(f"simulated {took:.1f} s" if result.get("simulated") else f"{took:.1f} s")
    if wall_s is not None:
        times.append(f"wall {wall_s:.2f} s")
    conc = result.get("max_concurrency")
    label = nodeid if f"conc{conc}" in nodeid else f"{nodeid} conc{conc}"
    return ", ".join([f"{label}: {verdict}", done, *times])
