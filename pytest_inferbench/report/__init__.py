"""Reporting: JUnit properties, per-node terminal tables, summary.json, step summary, plots.

Everything the controller shows is built from test reports, which xdist forwards from the
workers, so `-n 2` prints the same tables as a serial run. Hooks for `plugin`:

- in the item body: `item.user_properties.extend(result_properties(result))`;
- `pytest_configure`: `register(config)` (controller only; the collector is a plugin object
  that implements `pytest_runtest_logreport`, `pytest_sessionfinish` and
  `pytest_terminal_summary` itself);
- `pytest_runtest_makereport` wrapper: `attach_result(item, report)` puts the full results on
  the report (builtin types; travels through xdist) for summary.json and baselines. A recipe
  point has one; a Python test one per point it ran, each its own row.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ..results import catalog
from ..state import RESULTS_KEY, STATE_KEY
from .live import register_lines
from .meta import run_metadata
from .tables import EVAL_PREFIX, markdown_tables, node_rows, terminal_tables

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..options import Settings
    from ..results.record import JSONValue, Record
    from .plots import PendingPlots
    from .tables import Row

RESULTS_ATTR = "inferbench_results"
COLLECTOR_NAME = "inferbench-report"

def _builtin(value: JSONValue) -> JSONValue:
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return round(value, 6)
    return str(value)


def result_properties(result: Record) -> list[tuple[str, JSONValue]]:
    """Key results as builtin-typed (name, value) pairs, in the metric catalog's order (its
    JUnit properties); absent or null keys are left out."""
    return [(key, _builtin(result[key])) for key in catalog.junit_properties()
            if result.get(key) is not None]


def attach_result(item: pytest.Item, report: pytest.TestReport) -> None:
    """Put this point's full result on its call report (for the controller's summary.json).

    A point whose server never started gets its identity on the setup report, so the tables
    still show it (as an error).
    """
    point = getattr(item, "point", None)
    if report.when == "setup" and report.outcome != "passed" and point is not None:
        report.user_properties.extend(
            [
                ("server_node", point.server.node_name),
                ("config_key", point.server.config_key),
                ("isl", point.isl),
                ("osl", point.osl),
                ("conc", point.conc),
            ]
        )
    if report.when != "call":
        return

    results = item.stash.get(RESULTS_KEY, None)
    if results:
        from ..results.build import PER_REQUEST_KEYS

        # As one JSON text: xdist's workers send reports through a serializer that walks every
        # value in Python, and a point's record holds about 150 of them (NaN and inf survive).
        setattr(report, RESULTS_ATTR, json.dumps([
            {k: v for k, v in result.items() if k not in PER_REQUEST_KEYS}
            for result in results]))


def report_results(report: pytest.TestReport) -> list[dict[str, JSONValue]]:
    """The full results `attach_result` put on a report (none on most reports)."""
    text = getattr(report, RESULTS_ATTR, None)
    results = json.loads(text) if isinstance(text, str) else []
    return [r for r in results if isinstance(r, dict)]


def register(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # workers forward reports; the controller summarizes
    collector = ReportCollector(config)
    config.pluginmanager.register(collector, COLLECTOR_NAME)
    register_lines(config, config.stash[STATE_KEY].settings.progress, report_results)
    if config.pluginmanager.hasplugin("html"):
        from .html import HtmlPlots

        config.pluginmanager.register(HtmlPlots(collector), f"{COLLECTOR_NAME}-html")


class ReportCollector:
    """Collects benchmark and eval reports on the controller and writes every summary."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.points: dict[str, dict[str, object]] = {}  # nodeid -> row (properties + verdict)
        self.results: dict[str, Row] = {}  # nodeid -> full result
        self.started = time.time()
        self.written: list[Path] = []
        self.notes: list[str] = []
        self.errors: list[str] = []  # run-level files that could not be written, one line each
        self.finished = False
        self._plots: PendingPlots | None = None  # started by finish()
        self.plots_dir = Path("plots")  # under the results directory, once finish() knows it

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        if "server_node" not in props and not any(k.startswith(EVAL_PREFIX) for k in props):
            return
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            verdict = "error" if report.when == "setup" and report.failed else report.outcome
            reason = _first_line(report) if report.outcome != "passed" else ""
            results = report_results(report)
            if len(results) <= 1:
                self._add(report.nodeid, dict(props), verdict, reason,
                          results[0] if results else None)
                return
            for index, result in enumerate(results):  # a Python test that ran several points
                self._add(f"{report.nodeid}[{index}]", dict(result_properties(result)), verdict,
                          reason, result)

    def _add(self, nodeid: str, row: dict[str, object], verdict: str, reason: str,
             result: Row | None) -> None:
        row.update({"nodeid": nodeid, "verdict": verdict, "reason": reason})
        self.points[nodeid] = row
        if isinstance(result, dict):
            self.results[nodeid] = result

    def summary_points(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for nodeid, row in self.points.items():
            if "server_node" not in row:
                continue
            point = dict(self.results.get(nodeid, row))
            point.update({"nodeid": nodeid, "verdict": row["verdict"], "reason": row["reason"]})
            out.append(point)
        return out

    # First: every report is in once the test loop has ended, and under xdist the hooks after
    # this one wait for the workers' interpreters to exit; the plots draw meanwhile.
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.finish()
        if self.errors and session.exitstatus == pytest.ExitCode.OK:
            # Every test passed, but the run did not leave the files it was asked for.
            session.exitstatus = pytest.ExitCode.USAGE_ERROR

    def finish(self) -> None:
        """Write summary.json, the baseline, the step summary, and start the plots (once;
        `finish_plots` waits for them)."""
        settings = _settings(self.config)
        if self.finished or settings is None or not self.points:
            return
        from ..gates.baseline import save_baseline
        from ..results.build import write_json_atomic

        self.finished = True
        points = self.summary_points()
        if settings.plots and points:  # first: they draw while the rest is written
            from .plots import start_plots

            self.plots_dir = settings.results_dir / "plots"
            try:
                self._plots = start_plots(points, self.plots_dir)
            except OSError as exc:
                self.errors.append(_cannot_write(self.plots_dir, exc))
            else:
                if self._plots is None:
                    self.notes.append("no plots: matplotlib is not installed "
                                      "(pip install 'pytest-inferbench[plot]')")
        meta = run_metadata(self.config, settings, points, self.started)
        summary_path = settings.results_dir / "summary.json"
        evals = [row for row in self.points.values() if "server_node" not in row]
        # One line (the C encoder): a matrix run's summary is tens of megabytes, which the
        # indenting encoder takes seconds over at the end of the run.
        self._write(summary_path, lambda: write_json_atomic(
            summary_path, {"metadata": meta, "points": points, "evals": evals}, indent=None))
        baseline = settings.save_baseline
        if baseline is not None:
            self._write(baseline, lambda: save_baseline(baseline, points, meta))
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            self._write(Path(step_summary), lambda: _append(
                Path(step_summary), markdown_tables(node_rows(self.points.values()), meta)))

    def _write(self, path: Path, write: Callable[[], object]) -> None:
        """Write one run-level file; one error line naming it when it cannot be written (a
        full disk), and the other files and the tables still come."""
        try:
            write()
        except OSError as exc:
            self.errors.append(_cannot_write(path, exc))
        else:
            self.written.append(path)

    def finish_plots(self) -> None:
        """Wait for the plots `finish` started (once)."""
        pending, self._plots = self._plots, None
        if pending is not None:
            try:
                self.written.extend(pending.finish())
            except OSError as exc:  # a full disk: the figures drawn so far stay
                self.errors.append(_cannot_write(self.plots_dir, exc))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        write_summary(terminalreporter, self)

    def pytest_unconfigure(self) -> None:
        self.finish_plots()  # a run without a terminal summary still gets its plots


def write_summary(
    terminalreporter: pytest.TerminalReporter, collector: ReportCollector | None = None
) -> None:
    """One table per server node, from the reports' user_properties (merged across workers)."""
    if collector is None:
        found = terminalreporter.config.pluginmanager.get_plugin(COLLECTOR_NAME)
        if not isinstance(found, ReportCollector):
            return
        collector = found
    if not collector.points:
        return
    terminalreporter.write_sep("=", "inferbench results")
    for line in terminal_tables(node_rows(collector.points.values())):
        terminalreporter.write_line(line)
    collector.finish_plots()
    for path in collector.written:
        terminalreporter.write_line(f"inferbench: wrote {path}")
    for note in collector.notes:
        terminalreporter.write_line(f"inferbench: {note}")
    for error in collector.errors:
        terminalreporter.write_line(f"inferbench: error: {error}", red=True, bold=True)


def _cannot_write(path: Path, exc: OSError) -> str:
    """One line: the file (the one the error names, else `path`) and why."""
    return f"cannot write {exc.filename or path}: {exc.strerror or exc}"


def _append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write(text)


def _settings(config: pytest.Config) -> Settings | None:
    state = config.stash.get(STATE_KEY, None)
    return state.settings if state is not None else None


def _first_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = str(getattr(crash, "message", "") or report.longreprtext or "").strip()
    if report.skipped and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2])
    return text.splitlines()[0] if text else ""
