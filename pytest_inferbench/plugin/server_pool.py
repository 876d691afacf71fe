"""The server pool: the one place a server is started, shared and stopped.

Every user of a server asks the pool: a recipe's `ServerNode` at its setup, and a Python test
through the `inferbench_server` fixture. Users that ask for the same server identity (the
`ServerConfig` without its points and recipe lines, and the launch directory its spec comes
from) share one start. A server stops when it is idle (no user holds it) at an item boundary
and the next item does not want it (`settle`), the way pytest tears down a scope whose last
item ran; whatever is still running stops at session end (`close`). Items that want the same
server are kept next to each other (`plugin/__init__.py`), so each server starts once per worker.

A start that fails is remembered until its server is settled: every user in that stretch
errors with the same message at once, without a new start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ..backends import get_backend
from ..backends.base import ServerStartError
from ..recipe.launch import resolve
from ..state import get_session_state

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..backends.base import ServerHandle
    from ..recipe.launch import ServerSpec
    from ..recipe.model import ServerConfig


@dataclass(frozen=True)
class ServerKey:
    """What decides how a server is started: equal keys share one start."""

    server: ServerConfig  # points, source file and lines cleared
    launch_dir: Path

    @property
    def name(self) -> str:
        return self.server.node_name


def server_key(config: pytest.Config, server: ServerConfig) -> ServerKey:
    settings = get_session_state(config).settings
    launch_dir = settings.launch_dir or settings.layout.launch_dir_for(server.source)
    return ServerKey(server=server.identity, launch_dir=Path(launch_dir).resolve())


@dataclass
class Lease:
    """One started (or failed) server and who holds it; `runner.RunningNode` for its points."""

    key: ServerKey
    name: str
    instance: str  # unique per start in this run: results name the server instance they ran on
    spec: ServerSpec | None = None
    handle: ServerHandle | None = None
    error: BaseException | None = None  # the failed start, re-raised to every user
    dead_reason: str | None = None  # set when the server died while a user ran a point
    holders: int = 0


@dataclass
class ServerPool:
    config: pytest.Config
    leases: dict[ServerKey, Lease] = field(default_factory=dict)
    starts: int = 0

    def acquire(self, server: ServerConfig) -> Lease:
        """The running server for `server`'s identity, started now when there is none."""
        key = server_key(self.config, server)
        lease = self.leases.get(key)
        if lease is None:
            lease = self._start(key, server)
        if lease.error is not None:
            raise lease.error
        lease.holders += 1
        return lease

    def release(self, lease: Lease) -> None:
        """A user is done; the server keeps running until `settle` finds nobody wants it."""
        lease.holders = max(lease.holders - 1, 0)

    def settle(self, wanted: Iterable[ServerKey]) -> None:
        """Stop every idle server that is not in `wanted` (what the next item asks for)."""
        keep = set(wanted)
        for key, lease in list(self.leases.items()):
            if lease.holders == 0 and key not in keep:
                self._stop(key)

    def close(self) -> list[str]:
        """Session end (also after an interrupt): stop everything, held or not. One server
        that fails to stop does not keep the others running; the failures are returned."""
        problems = []
        for key in list(self.leases):
            try:
                self._stop(key)
            except Exception as exc:
                problems.append(f"{key.name}: stopping the server failed: {exc}")
        return problems

    def _start(self, key: ServerKey, server: ServerConfig) -> Lease:
        state = get_session_state(self.config)
        settings = state.settings
        self.starts += 1
        lease = Lease(key=key, name=server.node_name,
                      instance=f"{state.start_context.worker_id}-{self.starts}")
        self.leases[key] = lease
        try:
            # Every backend needs the spec: the argv to run, or (external) the served model
            # name and client options.
            lease.spec = spec = resolve(server, key.launch_dir,
                                        startup_timeout_override=settings.startup_timeout_s)
            backend = get_backend(settings.backend)
            if spec.roles and not backend.supports_roles:
                raise ServerStartError(
                    f"{spec.launch_file}: a server of several roles "
                    f"({', '.join(r.name for r in spec.roles)}) needs the slurm backend, "
                    f"not {settings.backend}")
            if spec.files and not backend.supports_files:
                raise ServerStartError(
                    f"{spec.launch_file}: the server reads config files "
                    f"({', '.join(name for name, _ in spec.files)}) that the "
                    f"{settings.backend} backend does not write yet; the sim backend reads them")
            lease.handle = backend.start(server, spec, state.start_context)
        except Exception as exc:
            lease.error = exc
        return lease

    def _stop(self, key: ServerKey) -> None:
        lease = self.leases.pop(key)
        handle, lease.handle = lease.handle, None
        if handle is not None:
            handle.stop()


POOL_KEY = pytest.StashKey[ServerPool]()


def pool_for(config: pytest.Config) -> ServerPool:
    pool = config.stash.get(POOL_KEY, None)
    if pool is None:
        pool = config.stash[POOL_KEY] = ServerPool(config)
    return pool


def close_pool(config: pytest.Config) -> list[str]:
    pool = config.stash.get(POOL_KEY, None)
    return pool.close() if pool is not None else []


# The server an item wants, set at collection (recipe points, marked Python tests): the pool
# keeps it running across consecutive items that want it.
WANTS_KEY = pytest.StashKey[ServerKey]()


def wanted_by(item: pytest.Item | None) -> tuple[ServerKey, ...]:
    if item is None:
        return ()
    key = item.stash.get(WANTS_KEY, None)
    return (key,) if key is not None else ()


def settle_after(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After an item's teardown: stop the idle servers the next item does not want."""
    pool = item.config.stash.get(POOL_KEY, None)
    if pool is not None:
        pool.settle(wanted_by(nextitem))


def group_with_server(item: pytest.Item, key: ServerKey) -> None:
    """The item wants `key`'s server: the pool keeps it running for the next such item, and
    `-n --dist loadgroup` sends every such item to one worker (when xdist is there)."""
    item.stash[WANTS_KEY] = key
    if item.config.pluginmanager.hasplugin("xdist"):
        item.add_marker(pytest.mark.xdist_group(f"inferbench-{key.name}"))
