"""The backend registry: every backend's name, where its class lives, whether it simulates.

A new backend is one entry in `BACKENDS` (the `--inferbench-backend` choices come from it).
This module imports nothing, so options and reports can ask about a backend without loading it;
`backends.get_backend` imports the class only when a run selects it, so the default simulator
never imports the docker SDK and a docker run never imports the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["BACKENDS", "BackendInfo", "backend_info", "unsupported_reason"]


@dataclass(frozen=True)
class BackendInfo:
    name: str
    module: str  # under pytest_inferbench.backends
    class_name: str
    simulated: bool  # its results are predictions of a performance model, not measurements
    multinode: bool = False  # it runs multinode entries (disaggregated or aggregated)


BACKENDS: Mapping[str, BackendInfo] = {info.name: info for info in (
    BackendInfo("sim", "sim", "SimBackend", simulated=True, multinode=True),
    BackendInfo("sim-server", "simserver", "SimServerBackend", simulated=True),
    BackendInfo("docker", "docker", "DockerBackend", simulated=False),
    BackendInfo("process", "process", "ProcessBackend", simulated=False),
    # A running server is one endpoint whatever stands behind it: a deployment's router too.
    BackendInfo("external", "external", "ExternalBackend", simulated=False, multinode=True),
    BackendInfo("slurm", "slurm.backend", "SlurmBackend", simulated=False),
)}


def backend_info(name: str) -> BackendInfo:
    info = BACKENDS.get(name)
    if info is None:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
    return info


def unsupported_reason(backend: str, *, multinode: bool) -> str | None:
    """Why a backend cannot run a server node (a skip reason), or None when it can."""
    if multinode and not backend_info(backend).multinode:
        runs = ", ".join(name for name, info in BACKENDS.items() if info.multinode)
        return f"multinode: not supported by the {backend} backend yet (runs on: {runs})"
    return None
