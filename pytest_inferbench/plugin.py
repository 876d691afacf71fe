"""pytest hooks of pytest-inferbench: hooks only, each delegating to the module doing the work."""

from __future__ import annotations

from fnmatch import fnmatch
from typing import TYPE_CHECKING

import pytest

from . import collect, options, report, state, xdist_hooks
from .backends import reaper
from .changelog import items as changelog_items
from .evals.collect import EVAL_MARKER

if TYPE_CHECKING:
    from collections.abc import Generator
    from pathlib import Path


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "inferbench(config_key, model_prefix, framework, precision, runner, hardware, tp, ep, "
        "dp_attn, spec_decoding, isl, osl, conc): a generated benchmark point; select with "
        '-m "inferbench(conc=64)"',
    )
    state.create_session_state(config)
    xdist_hooks.register(config)
    report.register(config)
    config.addinivalue_line("markers", EVAL_MARKER)
    config.addinivalue_line("markers", changelog_items.CHANGELOG_MARKER)
    # CI cancels with SIGTERM, which would skip every teardown and leave servers running.
    reaper.install_sigterm_handler()


def pytest_unconfigure(config: pytest.Config) -> None:
    reaper.restore_sigterm_handler()


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if config.option.collectonly or hasattr(config, "workerinput"):
        return  # collection must not touch Docker; workers leave the sweep to the controller
    removed = reaper.sweep_stale_containers(state.get_session_state(config).settings)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for line in removed:
        if reporter is not None:
            reporter.write_line(f"inferbench: {line}")


def pytest_keyboard_interrupt() -> None:
    reaper.mark_interrupted()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    settings = state.get_session_state(parent.config).settings
    if any(fnmatch(file_path.name, pattern) for pattern in settings.recipe_globs):
        return collect.RecipeFile.from_parent(parent, path=file_path)
    if changelog_items.is_changelog(file_path, settings.recipe_globs):
        return changelog_items.ChangelogFile.from_parent(parent, path=file_path)
    return None


def pytest_report_header(config: pytest.Config) -> list[str]:
    settings = state.get_session_state(config).settings
    lines = [f"inferbench: backend {settings.backend}, results in {settings.results_dir}/"]
    if settings.backend in ("sim", "sim-server"):
        lines.append("inferbench: SIMULATED results -- predictions of a performance model, "
                     "not measurements of real hardware")
    return lines


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> str:
    points = [i for i in items if isinstance(i, collect.BenchItem)]
    if not points:
        return ""  # a run without recipes (the plugin's own tests) needs no inferbench line
    nodes = {i.server_node.nodeid for i in points}
    return f"inferbench: {len(nodes)} server nodes, {len(points)} benchmark points"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Reordering plugins could interleave servers and restart them; keep each node contiguous.
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(item.parent.nodeid if item.parent else "", index)
    items.sort(key=lambda i: first_seen[i.parent.nodeid if i.parent else ""])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    outcome = yield
    if isinstance(item, collect.BenchItem):
        collect.clean_longrepr(call, outcome)
        report.attach_result(item, outcome)
    return outcome
