"""The handle of every server this plugin starts itself (docker, process, sim-server).

`start_supervised` waits for readiness and stops the server before re-raising when it never
got ready (no handle exists then, so the node's teardown could not). `SupervisedHandle` adds
to the shared HTTP handle: `check_alive` from the server's own state, the log tail, and an
idempotent stop that also ends the log stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from . import reaper
from .base import ServerDiedError
from .http import HttpServerHandle
from .readiness import LogPump, ReadinessProbe, startup_timeout, wait_until_ready

if TYPE_CHECKING:
    from ..launch import ServerSpec
    from .base import StartContext


class Supervised(Protocol):
    """A server this plugin started: its state, its log, and an idempotent terminate."""

    name: str
    log: LogPump

    def exit_code(self) -> int | None: ...

    def terminate(self) -> None: ...


class SupervisedHandle(HttpServerHandle):
    """An HTTP handle that also watches and finally stops the server behind it."""

    def __init__(self, supervised: Supervised, *, base_url: str, spec: ServerSpec,
                 simulated: bool = False) -> None:
        super().__init__(base_url=base_url, spec=spec, simulated=simulated)
        self.supervised = supervised
        self._stopped = False
        reaper.track(self, self.stop)

    def check_alive(self) -> None:
        code = self.supervised.exit_code()
        if code is not None:
            raise ServerDiedError(
                f"server {self.supervised.name} exited with code {code} during the sweep; "
                f"log {self.supervised.log.path}\n--- last log lines ---\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return self.supervised.log.tail(lines)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            self.supervised.terminate()
        finally:
            reaper.untrack(self)
            self.supervised.log.join()


def start_supervised(supervised: Supervised, *, base_url: str, spec: ServerSpec,
                     ctx: StartContext, simulated: bool = False) -> SupervisedHandle:
    """Wait for readiness; on any failure stop the server before raising (no handle exists)."""
    reaper.track(supervised, supervised.terminate)
    try:
        timeout = startup_timeout(spec.startup_timeout_s, ctx.options.startup_timeout_s)
        wait_until_ready(ReadinessProbe(
            name=supervised.name, health_url=base_url + spec.health_path,
            exit_code=supervised.exit_code, log_tail=supervised.log.tail,
            log_path=supervised.log.path), timeout)
        return SupervisedHandle(supervised, base_url=base_url, spec=spec, simulated=simulated)
    except BaseException:
        supervised.terminate()
        supervised.log.join()
        raise
    finally:
        reaper.untrack(supervised)
