"""The collection tree: RecipeFile -> ServerNode -> BenchItem.

The tree is exactly three deep so `pytest -n N --dist loadscope` keeps every point of a server on
one worker (loadscope groups by the node id without its last part). A ServerNode starts its
server in `setup()` and stops it in `teardown()`; pytest runs the teardown even after a failed
setup and errors every point of a node whose setup failed, without retrying.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .backends.base import ServerDiedError, ServerStartError
from .launch import LaunchSpecError, ServerSpec, resolve
from .schema import RecipeError, load_recipe

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .backends.base import ServerHandle
    from .recipe import BenchPoint, InvalidEntry, ServerConfig


class RecipeFile(pytest.File):
    """One master config. Parsing happens here, lazily; nothing but the YAML is read.

    A file that cannot be read fails whole; an invalid entry fails only its own item, so one
    bad entry never hides the others.
    """

    def collect(self) -> Iterable[pytest.Item | pytest.Collector]:
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
                     style: Any = None) -> str:
        if isinstance(excinfo.value, InvalidEntryError):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.entry.line - 1, f"{self.entry.config_key}: invalid entry"


class ServerNode(pytest.Collector):
    """One server config: one server start shared by all of its points."""

    def __init__(self, *, server: ServerConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.server = server
        self.spec: ServerSpec | None = None
        self.handle: ServerHandle | None = None
        self.dead_reason: str | None = None  # set when the server died mid-sweep
        # -k matches these as well as the names in the node id.
        self.extra_keyword_matches.update(
            {server.framework, server.hardware.lower(), server.model_prefix, server.precision})

    def collect(self) -> Iterable[pytest.Item]:
        for point in self.server.points():
            yield BenchItem.from_parent(self, name=point.name, point=point,
                                        callobj=_bench_callobj())
        from .evals.collect import make_eval_item

        # Last, so it runs after the points on the same server.
        eval_item = make_eval_item(self, self.server)
        if eval_item is not None:
            yield eval_item

    def setup(self) -> None:
        from .backends import get_backend
        from .state import get_session_state

        state = get_session_state(self.config)
        settings = state.settings
        launch_dir = settings.launch_dir or settings.layout.launch_dir_for(self.server.source)
        # Every backend needs the spec: the argv to run, or (external) the served model name
        # and client options.
        self.spec = resolve(self.server, launch_dir,
                            startup_timeout_override=settings.startup_timeout_s)
        backend = get_backend(settings.backend)
        if self.spec.roles and not backend.supports_roles:
            raise ServerStartError(
                f"{self.spec.launch_file}: a server of several roles "
                f"({', '.join(r.name for r in self.spec.roles)}) needs the slurm backend, "
                f"not {settings.backend}")
        if self.spec.files and not backend.supports_files:
            raise ServerStartError(
                f"{self.spec.launch_file}: the server reads config files "
                f"({', '.join(name for name, _ in self.spec.files)}) that the "
                f"{settings.backend} backend does not write yet; the sim backend reads them")
        self.handle = backend.start(self.server, self.spec, state.start_context)

    def teardown(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.stop()

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.server.line - 1, self.name


class BenchItem(pytest.Function):
    """One (isl, osl, concurrency) point; a Function so fixtures and -k/-m work as usual."""

    def __init__(self, *, point: BenchPoint, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.point = point
        self.add_marker(pytest.mark.inferbench(**point.marker_kwargs()))
        if point.repeated_at:
            # The recipe gives this point more than once; it runs once. -k duplicate finds it.
            self.keywords["duplicate"] = "also at line " + ", ".join(map(str, point.repeated_at))
            self.extra_keyword_matches.add("duplicate")
        if point.server.skip_reason:
            self.add_marker(pytest.mark.skip(reason=point.server.skip_reason))

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


def _bench_callobj() -> Any:
    """A fresh function per item: pytest keys fixture closures and marks on the function."""
    from .runner import run_bench_item

    def run_point(request: pytest.FixtureRequest) -> None:
        """Run this benchmark point against its server node and check its gates."""
        item = request.node
        assert isinstance(item, BenchItem)
        run_bench_item(item, item.point, item.server_node)

    return run_point


# Errors whose message already says everything; a traceback into the plugin would hide it.
CLEAN_ERRORS = (ServerStartError, ServerDiedError, LaunchSpecError)


def clean_longrepr(call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
    if call.excinfo is not None and isinstance(call.excinfo.value, CLEAN_ERRORS):
        report.longrepr = str(call.excinfo.value)
