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
    # It replays agentic-coding traces (`loadgen/replay_schedule.py`: over HTTP, or in process).
    agentic: bool = False
    kv_offload: bool = True  # a kv-offloading point's KV tier is served (real or simulated)
    # What it lacks to replay them, where that is more than the wiring: said in the skip reason.
    agentic_missing: str | None = None


BACKENDS: Mapping[str, BackendInfo] = {info.name: info for info in (
    # It replays them on one engine, or on a multinode deployment's instances behind its router.
    BackendInfo("sim", "sim", "SimBackend", simulated=True, multinode=True, agentic=True),
    # Its engine has the CPU-DRAM tier a dram point's offload flags size (docs/simulator.md).
    BackendInfo("sim-server", "simserver", "SimServerBackend", simulated=True, agentic=True),
    # The backends that start a server replay agentic traces against it over HTTP.
    BackendInfo("docker", "docker", "DockerBackend", simulated=False, agentic=True),
    BackendInfo("process", "process", "ProcessBackend", simulated=False, agentic=True),
    # A running server is one endpoint whatever stands behind it: a deployment's router too.
    BackendInfo("external", "external", "ExternalBackend", simulated=False, multinode=True,
                agentic=True),
    BackendInfo("slurm", "slurm.backend", "SlurmBackend", simulated=False, agentic=True),
)}


def backend_info(name: str) -> BackendInfo:
    info = BACKENDS.get(name)
    if info is None:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
    return info


def unsupported_reason(backend: str, *, multinode: bool, agentic: bool = False,
                       offloading: str = "none") -> str | None:
    """Why a backend cannot run a server node (a skip reason), or None when it can: an
    agentic-coding node needs the trace replay (and, simulated, KV offloading of the current
    schema's `dram` kind)."""
    info = backend_info(backend)
    if agentic and not info.agentic:
        lacks = info.agentic_missing and f"missing: {info.agentic_missing}"
        runs = ", ".join(name for name, other in BACKENDS.items() if other.agentic)
        return (f"agentic-coding: agentic trace replay is not implemented on the {backend} "
                f"backend yet ({lacks or f'it runs on: {runs}'})")
    if agentic and offloading not in ("none", "dram") and info.simulated:
        # The older schema's `offloading` kinds: the simulator's tier is sized only by
        # `kv-offloading: dram`'s total-cpu-dram-gb.
        return (f"agentic-coding: offloading {offloading} is not simulated (the simulator's "
                "CPU-DRAM tier serves kv-offloading: dram)")
    if agentic and offloading != "none" and not info.kv_offload:
        return (f"agentic-coding: kv-offloading {offloading} is not simulated on the {backend} "
                "backend yet (the sim-server backend simulates the CPU-DRAM tier)")
    if multinode and not info.multinode:
        runs = ", ".join(name for name, info in BACKENDS.items() if info.multinode)
        return f"multinode: not supported by the {backend} backend yet (runs on: {runs})"
    return None
