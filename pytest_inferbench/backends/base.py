"""The contract between a server node and whatever serves it.

A `Backend` starts one `ServerHandle` per server node (at the node's setup) and every point of
that node runs through `ServerHandle.run_point`. Handles must make `stop()` idempotent and safe
after a half-done start: pytest calls the node's teardown even when its setup failed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..loadgen.workload import LoadSettings

__all__ = ["LoadSettings"]  # how a point loads its server lives with the workload

if TYPE_CHECKING:
    from pathlib import Path

    from ..loadgen.progress import ProgressOutput
    from ..options import Settings
    from ..recipe.launch import ServerSpec
    from ..recipe.model import BenchPoint, ServerConfig
    from ..results.measurement import PointMeasurement


class ServerStartError(RuntimeError):
    """The server never became ready; the message carries the cause and the log tail."""


class ServerDiedError(RuntimeError):
    """The server stopped serving during a sweep; the message carries the log tail."""


class PointNotMeasuredError(RuntimeError):
    """The server is fine but this point could not be measured (the simulator rejects one of
    its requests outright); the message says why. Fails the point alone."""


MAIN_WORKER = "master"  # the worker id of a run without xdist workers (xdist's own word)


@dataclass(frozen=True)
class StartContext:
    """What a backend needs besides the node itself."""

    results_dir: Path
    run_id: str  # one per pytest session; container labels and log names carry it
    worker_id: str  # MAIN_WORKER or the xdist worker id
    options: Settings
    # Server log files this session has named, so a node started twice gets a second file.
    log_paths: set[Path] = field(default_factory=set, compare=False)


class ServerHandle(ABC):
    """A started server node."""

    base_url: str | None = None  # None for the in-process virtual-time simulator

    @abstractmethod
    def run_point(self, point: BenchPoint, load: LoadSettings,
                  progress: ProgressOutput | None = None) -> PointMeasurement:
        """Drive one load point against this server (`progress`: where to show how it goes;
        None: the live line when there is a terminal)."""

    def check_alive(self) -> None:  # noqa: B027 - default: nothing to check
        """Raise ServerDiedError (with the log tail) if the server is gone."""

    def log_tail(self, lines: int = 40) -> str:
        return ""

    @abstractmethod
    def stop(self) -> None:
        """Stop and clean up; idempotent, safe after a failed start."""


class Backend(ABC):
    name: str
    supports_roles = False  # can start a server made of several roles (launch spec `roles:`)
    # can give the server the config files of launch spec `files:` (TensorRT-LLM's options YAML)
    supports_files = False

    @abstractmethod
    def start(self, server: ServerConfig, spec: ServerSpec,
              ctx: StartContext) -> ServerHandle:
        """Start serving `server`; raise ServerStartError with the cause and log tail."""
