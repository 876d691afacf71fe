"""Server backends: how a server node is served (simulated, containerized, local, external).

`registry.BACKENDS` names them; `get_backend` imports the selected one's class.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ..options.backend_registry import BACKENDS, BackendInfo, backend_info
from .base import Backend

if TYPE_CHECKING:
    from ..options import Settings

__all__ = ["BACKENDS", "BackendInfo", "backend_info", "get_backend", "sim_calibration_problem",
           "simulator_lacks_hardware", "sweep_stale"]


def get_backend(name: str) -> Backend:
    """A new instance of the backend called `name` (its module is imported now)."""
    info = backend_info(name)
    cls = getattr(importlib.import_module(f"{__name__}.{info.module}"), info.class_name)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"backends.{info.module}.{info.class_name} is not a Backend")
    return cls()


def simulator_lacks_hardware(hardware: str) -> str | None:
    """Why the simulator cannot serve `hardware` (its catalog has no such entry), or None.

    The recipe model accepts runners by name alone; the simulator needs the accelerator's
    figures, so a runner added to one and not the other must be caught before any start."""
    from ..sim import catalog

    try:
        catalog.hardware(hardware)
    except catalog.CatalogError as exc:
        return str(exc)
    return None


def sim_calibration_problem(settings: Settings) -> str | None:
    """Why the run's simulator calibration file cannot be used, or None."""
    from .sim import calibration_problem

    return calibration_problem(settings)


def sweep_stale(settings: Settings) -> list[str]:
    """Session start, controller only: what earlier runs killed before their teardown left
    behind for this run's backend (containers, Slurm allocations); one line per removal."""
    from .reaper import sweep_stale_containers, sweep_stale_processes

    # Local servers of any earlier run, whatever its backend: a process outlives a backend change.
    lines = sweep_stale_processes()
    if settings.backend == "slurm":
        from .slurm.jobs import sweep_stale_jobs

        return [*lines, *sweep_stale_jobs()]
    return [*lines, *sweep_stale_containers(settings)]
