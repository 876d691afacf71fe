"""pytest hooks of pytest-inferbench: hooks only, each delegating to the module doing the work.

A run without recipes and without inferbench options sees no trace of the plugin
(`activation.py`): no header, no signal handler, no report collector.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from .. import options, report, state
from ..backends import reaper
from ..changelog import items as changelog_items
from ..evals.collect import EVAL_MARKER
from ..results import redact
from . import activation, collect, fixtures, preflight, server_pool, xdist_hooks
from .server_marker import MARKER_HELP

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
    config.addinivalue_line("markers", MARKER_HELP)
    state.create_session_state(config, preflight.checked_settings(config))
    # Fixtures for benchmarks in Python: inert until a test asks for one.
    config.pluginmanager.register(fixtures, "inferbench-fixtures")
    xdist_hooks.register(config)
    config.addinivalue_line("markers", EVAL_MARKER)
    config.addinivalue_line("markers", changelog_items.CHANGELOG_MARKER)
    if options.given(config):
        activation.engage(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    activation.disengage(config)


def pytest_collection_finish(session: pytest.Session) -> None:
    # After collection, before the first server starts: the files the points will read.
    if session.config.option.collectonly:
        collect.fail_collect_only_on_invalid_entries(session)
        return
    if hasattr(session.config, "workerinput"):
        return  # an xdist controller checks what its workers collected (xdist_hooks)
    servers = dict.fromkeys(i.point.server for i in session.items
                            if isinstance(i, collect.BenchItem))
    session_state = state.get_session_state(session.config)
    preflight.check_collected(servers, session_state.settings)
    activation.begin_run(session.config, session_state.settings, session_state.run_id)


def pytest_keyboard_interrupt() -> None:
    reaper.mark_interrupted()


@pytest.hookimpl(tryfirst=True)
def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # pytest skips dot-directories (InferenceX's .github/configs); retired configs and, at an
    # InferenceX checkout's root, InferenceX's own Python tests are left out.
    return collect.ignores(collection_path, config)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    settings = state.get_session_state(parent.config).settings
    if not activation.is_benchmark_file(file_path, settings):
        return None
    activation.engage(parent.config)
    if activation.is_recipe_file(file_path, settings):
        return collect.RecipeFile.from_parent(parent, path=file_path)
    return changelog_items.ChangelogFile.from_parent(parent, path=file_path)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return activation.header_lines(config, state.get_session_state(config).settings)


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    # Engaged by recipes or fixture users: the header was printed before collection found them.
    lines = activation.header_lines(config, state.get_session_state(config).settings)
    points = [i for i in items if isinstance(i, collect.BenchItem)]
    if not points:
        return lines  # no recipes: no count line (the plugin's own tests, Python benchmarks)
    nodes = {i.server_node.nodeid for i in points}
    return [*lines, f"inferbench: {len(nodes)} server nodes, {len(points)} benchmark points"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rev = state.get_session_state(config).settings.changed_since
    if rev is not None:
        from .selection import changed_since

        changed_since(config, items, rev)
    fixtures.mark_server_users(config, items)


# pytest registers only names that start with `pytest_`, also for a hookimpl with a specname.
@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_keep_servers_contiguous(items: list[pytest.Item]) -> None:
    # Reordering plugins could interleave servers and restart them: every user of a server (a
    # recipe node's items, tests marked for it) moves up to its first user; other items keep
    # their places, so a run without servers keeps pytest's order.
    first_seen: dict[server_pool.ServerKey, int] = {}
    for index, item in enumerate(items):
        for key in server_pool.wanted_by(item):
            first_seen.setdefault(key, index)
    position = {id(item): index for index, item in enumerate(items)}
    items.sort(key=lambda i: min((first_seen[k] for k in server_pool.wanted_by(i)),
                                 default=position[id(i)]))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        server_pool.settle_after(item, nextitem)


def pytest_sessionfinish(session: pytest.Session) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = server_pool.close_pool(session.config)
    if state.NOTHING_CHANGED_KEY in session.config.stash:
        from .selection import nothing_changed

        lines += [line for line in [nothing_changed(session)] if line]
    for line in lines:
        if reporter is not None:
            reporter.write_line(f"inferbench: {line}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    outcome = yield
    if isinstance(item, collect.BenchItem):
        collect.clean_longrepr(call, outcome)
    report.attach_result(item, outcome)
    if activation.is_engaged(item.config) and outcome.failed:
        redact.mask_report(outcome, state.get_session_state(item.config).redactor)
    return outcome
