"""The `sim-server` backend: the simulated engine over real HTTP, as a local subprocess.

The launch spec's argv (the real server's flags) is handed to `python -m pytest_inferbench.sim
serve` after `--`, so the simulator is configured by exactly what the real server would get.
It runs through the process backend's machinery: own process group, log file, readiness on
health and exit status, group killed at teardown. Its numbers are simulated and say so.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from .base import Backend
from .process import start_local
from .readiness import free_port

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..recipe.launch import ServerSpec
    from ..recipe.model import ServerConfig
    from .base import StartContext
    from .supervised import SupervisedHandle


def sim_serve_argv(hardware: str, time_scale: float, server_argv: tuple[str, ...],
                   simulator_args: Sequence[str] = ()) -> tuple[str, ...]:
    return (sys.executable, "-m", "pytest_inferbench.sim", "serve", "--hardware", hardware,
            "--time-scale", str(time_scale), *simulator_args, "--", *server_argv)


def start_sim_server(name: str, hardware: str, spec: ServerSpec, ctx: StartContext, *,
                     time_scale: float, simulator_args: Sequence[str] = ()) -> SupervisedHandle:
    """Start the simulator as a supervised subprocess and wait until it is healthy."""
    port = free_port()
    argv = sim_serve_argv(hardware, time_scale, spec.argv_for_port(port), simulator_args)
    return start_local(name, argv, spec, port, ctx, simulated=True)


class SimServerBackend(Backend):
    name = "sim-server"

    def start(self, server: ServerConfig, spec: ServerSpec,
              ctx: StartContext) -> SupervisedHandle:
        path = ctx.options.sim_calibration
        if path is None:
            return start_sim_server(server.node_name, server.hardware, spec, ctx,
                                    time_scale=ctx.options.time_scale)
        handle = start_sim_server(server.node_name, server.hardware, spec, ctx,
                                  time_scale=ctx.options.time_scale,
                                  simulator_args=("--calibration", str(path.resolve())))
        handle.server_notes = (calibration_note(server, spec, ctx),)
        return handle


def calibration_note(server: ServerConfig, spec: ServerSpec, ctx: StartContext) -> str:
    """What the points of a calibrated simulated server say about its calibration (the server
    itself applies it; this reads the same argv to say which entry)."""
    from ..sim.args import engine_config_from_argv
    from .sim import CONFIG_ERRORS, load_calibration

    calibration = load_calibration(ctx.options)
    assert calibration is not None  # the caller checked the path; preflight read the file
    try:
        config, _ = engine_config_from_argv(
            spec.argv_for_port(spec.port), hardware=server.hardware, env=spec.env_dict,
            framework=spec.framework or server.framework, files=dict(spec.files))
    except CONFIG_ERRORS as exc:  # the server started, so this does not happen; say so
        return f"sim calibration {calibration.path}: the server argv cannot be read: {exc}"
    return calibration.note(config)
