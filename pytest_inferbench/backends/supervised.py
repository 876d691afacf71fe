"""The handle of every server this plugin starts itself (docker, process, sim-server).

`start_supervised` waits for readiness and stops the server before re-raising when it never
got ready (no handle exists then, so the node's teardown could not). `SupervisedHandle` adds
to the shared HTTP handle: `check_alive` from the server's own state, the log tail, and an
idempotent stop that also ends the log stream.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

import httpx

from . import reaper
from .base import PointNotMeasuredError, ServerDiedError
from .http import HttpServerHandle
from .readiness import LogPump, ReadinessProbe, startup_timeout, wait_until_ready

if TYPE_CHECKING:
    from ..loadgen.progress import ProgressOutput
    from ..recipe.launch import ServerSpec
    from ..recipe.model import BenchPoint
    from ..results.measurement import PointMeasurement
    from .base import LoadSettings, StartContext

# After failed requests: how long a dying server may take to show as exited (a container
# goes from "running" to "exited" some time after its connections drop).
SETTLE_S = 5.0


class Supervised(Protocol):
    """A server this plugin started: its state, its log, and an idempotent terminate."""

    name: str
    log: LogPump

    def exit_code(self) -> int | None: ...

    def exit_detail(self) -> str:
        """Why it stopped beyond the exit code (e.g. a Slurm job state); "" if nothing more."""
        ...

    def terminate(self) -> None: ...


class SupervisedHandle(HttpServerHandle):
    """An HTTP handle that also watches and finally stops the server behind it."""

    def __init__(self, supervised: Supervised, *, base_url: str, spec: ServerSpec,
                 simulated: bool = False, time_scale: float | None = None) -> None:
        super().__init__(base_url=base_url, spec=spec, simulated=simulated,
                         time_scale=time_scale)
        self.supervised = supervised
        self._stopped = False
        reaper.track(self, self.stop)

    def check_alive(self) -> None:
        code = self.supervised.exit_code()
        if code is not None:
            detail = self.supervised.exit_detail()
            raise ServerDiedError(
                f"server {self.supervised.name} exited with code {code} during the sweep"
                f"{' (' + detail + ')' if detail else ''}; "
                f"log {self.supervised.log.path}\n--- last log lines ---\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return self.supervised.log.tail(lines)

    def run_point(self, point: BenchPoint, load: LoadSettings,
                  progress: ProgressOutput | None = None) -> PointMeasurement:
        """The shared HTTP sweep, bracketed by liveness checks: a server that died before or
        during the point raises ServerDiedError (with the log tail) instead of reporting a
        point full of connection errors."""
        self.check_alive()
        try:
            measurement = super().run_point(point, load, progress)
        except ServerDiedError:
            raise
        except Exception:
            self._check_alive_after_failures()
            raise
        if any(not record.success for record in measurement.records):
            fault = measurement.replay.fault if measurement.replay is not None else ""
            try:
                self._check_alive_after_failures()
            except (ServerDiedError, PointNotMeasuredError) as exc:
                if not fault:
                    raise
                # The agentic replay's stop names the request that lost the server first.
                raise type(exc)(f"{fault}\n{exc}") from None
        return measurement

    def _check_alive_after_failures(self) -> None:
        """Failed requests may mean the server is dying: wait until it either exits (raise
        ServerDiedError) or answers its health check again (return, the failures are the
        point's own). A server that still runs and never answers (hung, stopped, swapping)
        fails the point with its log tail, the one place that may say why; the next point
        tries it again."""
        deadline = time.monotonic() + SETTLE_S
        with httpx.Client(trust_env=False, timeout=1.0) as client:
            while True:
                self.check_alive()
                try:
                    if client.get(self.health_url).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() >= deadline:
                    self.check_alive()
                    raise PointNotMeasuredError(
                        f"server {self.supervised.name} still runs but did not answer "
                        f"{self.health_url} for {SETTLE_S:g} s after requests of this point "
                        f"failed (hung or stopped?); log {self.supervised.log.path}\n"
                        f"--- last log lines ---\n{self.log_tail()}")
                time.sleep(0.1)

    @property
    def health_url(self) -> str:
        return f"{self.base_url}{self.spec.health_path}"

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
        ready = wait_until_ready(ReadinessProbe(
            name=supervised.name, health_url=base_url + spec.health_path,
            exit_code=supervised.exit_code, exit_detail=supervised.exit_detail,
            log_tail=supervised.log.tail,
            log_path=supervised.log.path), timeout)
        return SupervisedHandle(supervised, base_url=base_url, spec=spec,
                                simulated=simulated or ready.simulated,
                                time_scale=ready.time_scale)
    except BaseException:
        supervised.terminate()
        supervised.log.join()
        raise
    finally:
        reaper.untrack(supervised)
