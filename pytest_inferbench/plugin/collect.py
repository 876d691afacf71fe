"""The collection tree: RecipeFile -> ServerNode -> BenchItem.

The tree is exactly three deep so `pytest -n N --dist loadscope` keeps every point of a server on
one worker (loadscope groups by the node id without its last part). A ServerNode takes its
server from the pool (`server_pool.py`) in `setup()` and hands it back in `teardown()`; the pool
stops it once no following item wants it, so a Python test asking for the same server shares
the start. pytest runs the teardown even after a failed setup and errors every point of a node
whose setup failed, without retrying.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..backends.base import ServerDiedError, ServerStartError
from ..loadgen.prompts import MissingExtraError
from ..options.backend_registry import unsupported_reason
from ..recipe.agentic import SCENARIO as AGENTIC_SCENARIO
from ..recipe.launch import LaunchSpecError
from ..recipe.schema import RecipeError, load_recipe
from ..state import get_session_state
from .server_marker import note_collected
from .server_pool import group_with_server, pool_for, server_key

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from _pytest._code.code import TracebackStyle

    from ..backends.base import ServerHandle
    from ..recipe.launch import ServerSpec
    from ..recipe.model import BenchPoint, InvalidEntry, ServerConfig
    from .server_pool import Lease


def whole_checkout(config: pytest.Config) -> bool:
    """No path was named (pytest collects the directory it runs in): at an InferenceX
    checkout's root the plugin then collects only its own files (`Layout.ignores`)."""
    return config.args_source == pytest.Config.ArgsSource.INVOCATION_DIR


def ignores(path: Path, config: pytest.Config) -> bool | None:
    """`pytest_ignore_collect`: pytest names only paths it walks to, never one named on the
    command line (nor a directory above one), so a named path is always collected."""
    layout = get_session_state(config).settings.layout
    return layout.ignores(path, whole_checkout=whole_checkout(config))


def layout_lines(config: pytest.Config) -> list[str]:
    """What the layout leaves out of this run, for the header."""
    layout = get_session_state(config).settings.layout
    lines = []
    if layout.inferencex and whole_checkout(config):
        owned = " and ".join(p.relative_to(layout.root).as_posix() + ("/" if p.is_dir() else "")
                             for p in layout.owned())
        lines.append(f"InferenceX checkout: collecting {owned} (name a path to collect other "
                     "tests)")
    named = [(config.invocation_params.dir / arg.split("::")[0]).resolve() for arg in config.args]
    left_out = [d for d in layout.left_out if any(p in d.resolve().parents for p in named)]
    if left_out:
        shown = ", ".join(d.relative_to(layout.root).as_posix() + "/" for d in left_out)
        lines.append(f"retired configs in {shown} left out (--inferbench-include-deprecated "
                     "collects them)")
    return lines


class RecipeFile(pytest.File):
    """One master config. Parsing happens here, lazily; nothing but the YAML is read.

    A file that cannot be read fails whole; an invalid entry fails only its own item, so one
    bad entry never hides the others.
    """

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
        note_collected(self.config, self.path)
        try:
            recipe = load_recipe(self.path, strict=False)
        except RecipeError as exc:
            raise self.CollectError(str(exc)) from None
        children: list[tuple[int, pytest.Item | pytest.Collector]] = [
            (entry.line, InvalidEntryItem.from_parent(self, name=entry.config_key, entry=entry))
            for entry in recipe.invalid_entries
        ]
        children += [(server.line, ServerNode.from_parent(self, name=server.node_name,
                                                          server=server))
                     for server in recipe.servers]
        children.sort(key=lambda child: child[0])  # file order; sort is stable within an entry
        for _, child in children:
            yield child


class InvalidEntryError(Exception):
    """An entry of a recipe file failed validation (the message lists every problem)."""


class InvalidEntryItem(pytest.Item):
    """Stands for an invalid master entry: it fails with every `file:line` problem of the entry,
    while the file's other entries collect and run."""

    def __init__(self, *, entry: InvalidEntry, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entry = entry

    def runtest(self) -> None:
        raise InvalidEntryError("\n".join(self.entry.problems))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: TracebackStyle | None = None) -> str:
        if isinstance(excinfo.value, InvalidEntryError):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.entry.line - 1, f"{self.entry.config_key}: invalid entry"


def fail_collect_only_on_invalid_entries(session: pytest.Session) -> None:
    """`--collect-only`: every selected invalid entry's problems on the terminal, each with its
    `file:line`, and counted as collection errors, so the run exits non-zero (a CI step that
    validates configs this way must not pass a broken one). A normal run keeps them as failing
    items, so the file's valid entries still run."""
    invalid = [item for item in session.items if isinstance(item, InvalidEntryItem)]
    if not invalid:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for item in invalid:
        for problem in item.entry.problems:
            if reporter is not None:
                reporter.write_line(f"inferbench: invalid entry {item.entry.config_key}: "
                                    f"{problem}")
    session.testsfailed += len(invalid)


class ServerNode(pytest.Collector):
    """One server config: one server start shared by all of its points."""

    def __init__(self, *, server: ServerConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.server = server
        self.lease: Lease | None = None  # the pool's server, held from setup to teardown
        self.wants = server_key(self.config, server)
        # -k matches these as well as the names in the node id.
        self.extra_keyword_matches.update(
            {server.framework, server.hardware.lower(), server.model_prefix, server.precision})

    def collect(self) -> Iterable[pytest.Item]:
        rates = get_session_state(self.config).settings.request_rates
        for point in self.server.points(rates):
            item = BenchItem.from_parent(self, name=point.name, point=point,
                                         callobj=_bench_callobj())
            group_with_server(item, self.wants)
            yield item
        from ..evals.collect import make_eval_items

        # Last, so they run after the points on the same server.
        for eval_item in make_eval_items(self, self.server):
            group_with_server(eval_item, self.wants)
            yield eval_item

    def setup(self) -> None:
        self.lease = pool_for(self.config).acquire(self.server)

    def teardown(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            pool_for(self.config).release(lease)

    # What the node's points read (`runner.RunningNode`), from the shared server it holds.
    @property
    def spec(self) -> ServerSpec | None:
        return self.lease.spec if self.lease is not None else None

    @property
    def handle(self) -> ServerHandle | None:
        return self.lease.handle if self.lease is not None else None

    @property
    def dead_reason(self) -> str | None:
        return self.lease.dead_reason if self.lease is not None else None

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.server.line - 1, self.name


class BenchItem(pytest.Function):
    """One (isl, osl, concurrency) point; a Function so fixtures and -k/-m work as usual."""

    def __init__(self, *, point: BenchPoint, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.point = point
        for kwargs in point.marker_variants():  # the first as written: get_closest_marker's
            self.add_marker(pytest.mark.inferbench(**kwargs))
        if point.repeated_at:
            # The recipe gives this point more than once; it runs once. -k duplicate finds it.
            self.keywords["duplicate"] = "also at line " + ", ".join(map(str, point.repeated_at))
            self.extra_keyword_matches.add("duplicate")
        backend = get_session_state(self.config).settings.backend
        agentic = point.server.scenario == AGENTIC_SCENARIO
        reason = (None if agentic else point.server.skip_reason) or unsupported_reason(
            backend, multinode=point.server.multinode, agentic=agentic,
            offloading=point.server.offloading)
        if reason:
            self.add_marker(pytest.mark.skip(reason=reason))

    def setup(self) -> None:
        super().setup()
        dead = self.server_node.dead_reason
        if dead is not None:
            # The server died during an earlier point: error at once instead of timing out.
            raise ServerDiedError(f"server died during an earlier point of this node:\n{dead}")

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.point.line - 1, f"{self.parent.name}::{self.name}"  # type: ignore[union-attr]

    @property
    def server_node(self) -> ServerNode:
        assert isinstance(self.parent, ServerNode)
        return self.parent


def _bench_callobj() -> Callable[[pytest.FixtureRequest], None]:
    """A fresh function per item: pytest keys fixture closures and marks on the function."""
    from .runner import run_bench_item

    def run_point(request: pytest.FixtureRequest) -> None:
        """Run this benchmark point against its server node and check its gates."""
        item = request.node
        assert isinstance(item, BenchItem)
        lease = item.server_node.lease
        if lease is None:  # setup failed; pytest already reported it, never reached in practice
            pytest.fail(f"{item.server_node.name}: server was not started", pytrace=False)
        run_bench_item(item, item.point, lease)

    return run_point


# Errors whose message already says everything; a traceback into the plugin would hide it.
CLEAN_ERRORS = (ServerStartError, ServerDiedError, LaunchSpecError, MissingExtraError)


def clean_longrepr(call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
    if call.excinfo is not None and isinstance(call.excinfo.value, CLEAN_ERRORS):
        report.longrepr = str(call.excinfo.value)
