"""The plugin acts only in runs that use it.

Installed in an environment, the plugin must leave other pytest runs as they were: no SIGTERM
handler, no header line, no report collector. It engages when the command line or the ini file
sets an inferbench option (at configure), or when collection finds a recipe or changelog file
(in-process at `pytest_collect_file`; on an xdist controller, which collects nothing, when a
worker reports such items). Engaging installs the SIGTERM handler and registers the report
collector; `disengage` at unconfigure restores the previous SIGTERM handler. What it changed is
kept in the config stash, so every session (pytester runs several in one process) starts clean.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .. import report
from ..backends import reaper
from .collect import layout_lines

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..backends.reaper import SignalHandler
    from ..options import Settings


@dataclass
class Activation:
    engaged: bool = False
    header_shown: bool = False
    begun: bool = False
    restore: list[SignalHandler] = field(default_factory=list)  # the handler before ours
    results_lock: int | None = None  # held from the run's start to its end (`run_dir`)


ACTIVATION_KEY = pytest.StashKey[Activation]()


def _activation(config: pytest.Config) -> Activation:
    return config.stash.setdefault(ACTIVATION_KEY, Activation())


def is_engaged(config: pytest.Config) -> bool:
    return _activation(config).engaged


def engage(config: pytest.Config) -> None:
    """Install the SIGTERM handler and the report collector (once per session)."""
    activation = _activation(config)
    if activation.engaged:
        return
    activation.engaged = True
    activation.restore.extend(reaper.install_sigterm_handler())
    report.register(config)


def run_begun(config: pytest.Config) -> bool:
    return _activation(config).begun


def begin_run(config: pytest.Config, settings: Settings, run_id: str) -> None:
    """Once per engaged session, on the controller, before the first server starts: remove
    what killed runs left (containers, allocations, server processes, temp files), move an
    earlier run's results aside and record this run (`run_dir`). A worker, a collect-only run
    and an unengaged one touch nothing."""
    activation = _activation(config)
    if (activation.begun or not activation.engaged or config.option.collectonly
            or hasattr(config, "workerinput")):
        return
    activation.begun = True
    from ..backends import sweep_stale
    from ..results import run_dir

    try:
        prepared, activation.results_lock = run_dir.prepare(
            settings.results_dir, run_id, (config.invocation_params.dir, config.rootpath),
            keep=settings.keep_runs)
    except run_dir.ResultsDirError as exc:
        raise pytest.UsageError(f"inferbench: {exc}") from None
    lines = [*sweep_stale(settings), *prepared]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None:
            reporter.write_line(f"inferbench: {line}")


def disengage(config: pytest.Config) -> None:
    """At unconfigure: put back the SIGTERM handler that was there before, and let the next
    run take the results directory."""
    activation = config.stash.get(ACTIVATION_KEY, None)
    if activation is not None and activation.restore:
        reaper.restore_sigterm_handler(activation.restore.pop())
    if activation is not None and activation.results_lock is not None:
        from ..results import run_dir

        run_dir.release(activation.results_lock)
        activation.results_lock = None


def is_recipe_file(path: Path, settings: Settings) -> bool:
    """A master-config file, by the `inferbench_recipes` globs."""
    return any(fnmatch(path.name, pattern) for pattern in settings.recipe_globs)


def is_benchmark_file(path: Path, settings: Settings) -> bool:
    """A recipe or a `perf-changelog.yaml` beside recipes."""
    return is_recipe_file(path, settings) or settings.layout.is_changelog(path,
                                                                      settings.recipe_globs)


def engage_for_node_ids(config: pytest.Config, node_ids: Iterable[str],
                        settings: Settings) -> None:
    """xdist controller: engage when a worker collected items of a benchmark file."""
    if not is_engaged(config) and any(
            is_benchmark_file(config.rootpath / nodeid.split("::", 1)[0], settings)
            for nodeid in node_ids):
        engage(config)


def engage_for_report(config: pytest.Config, test_report: pytest.TestReport) -> None:
    """xdist controller: engage at the first report that carries results (a Python test that
    used the fixtures, which the controller cannot see at collection), and hand that report to
    the collector registered now."""
    if is_engaged(config) or not getattr(test_report, report.RESULTS_ATTR, None):
        return
    engage(config)
    collector = config.pluginmanager.get_plugin(report.COLLECTOR_NAME)
    if isinstance(collector, report.ReportCollector):
        collector.pytest_runtest_logreport(test_report)


def header_lines(config: pytest.Config, settings: Settings) -> list[str]:
    """The backend and SIMULATED lines, once per session, only when the plugin is engaged."""
    activation = _activation(config)
    if not activation.engaged or activation.header_shown:
        return []
    activation.header_shown = True
    lines = [f"inferbench: backend {settings.backend}, results in {settings.results_dir}/"]
    if settings.simulated:
        lines.append("inferbench: SIMULATED results -- predictions of a performance model, "
                     "not measurements of real hardware")
    from ..evals.collect import threshold_tasks_not_run

    return [*lines, *threshold_tasks_not_run(settings),
            *(f"inferbench: {line}" for line in layout_lines(config))]
