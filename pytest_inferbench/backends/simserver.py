"""The `sim-server` backend: the simulated engine over real HTTP, as a local subprocess.

The launch spec's argv (the real server's flags) is handed to `python -m pytest_inferbench.sim
serve` after `--`, so the simulator is configured by exactly what the real server would get.
It runs through the process backend's machinery: own process group, log file, readiness on
health and exit status, group killed at teardown. Its numbers are simulated and say so, each
with the error expected of its regime (or its calibration) and its power by the simulator's
power model (the server's energy counters, read in `measured.py`), as the in-process backend's.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING

from .base import Backend
from .process import start_local
from .readiness import free_port

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..recipe.launch import ServerSpec
    from ..recipe.model import ServerConfig
    from ..sim.calibrate.file import Calibration
    from ..sim.config import EngineConfig
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
        from .sim import load_calibration

        path = ctx.options.sim_calibration
        calibration = load_calibration(ctx.options)
        simulator_args = () if path is None else ("--calibration", str(path.resolve()))
        handle = start_sim_server(server.node_name, server.hardware, spec, ctx,
                                  time_scale=ctx.options.time_scale,
                                  simulator_args=simulator_args)
        # The server reads the same argv into the same engine config; read here, it says
        # which calibration entry applies and what error the server's points are expected to
        # have, as the in-process backend's do.
        config = engine_config(server, spec, calibration)
        if calibration is not None:
            handle.server_notes = (calibration.note(config) if not isinstance(config, str)
                                   else f"sim calibration {calibration.path}: {config}",)
        expect_simulated_error(handle, config, calibration)
        return handle


def expect_simulated_error(handle: SupervisedHandle, config: EngineConfig | str,
                           calibration: Calibration | None = None) -> None:
    """A simulated server's points carry the error expected of their regime (or of their
    calibration), as the in-process backend's: every backend that serves the simulator
    (`sim-server`, `--inferbench-docker-sim`, `--inferbench-slurm-sim`) asks this."""
    from .sim import point_expected_error

    if not isinstance(config, str):
        handle.expected_error = partial(point_expected_error, config, calibration)


def engine_config(server: ServerConfig, spec: ServerSpec,
                  calibration: Calibration | None) -> EngineConfig | str:
    """The engine config the simulated server runs (the calibration's knobs applied), or why
    the argv cannot be read (the server started, so this does not happen; say so)."""
    from ..sim.args import engine_config_from_argv
    from .sim import CONFIG_ERRORS

    try:
        config, _ = engine_config_from_argv(
            spec.argv_for_port(spec.port), hardware=server.hardware, env=spec.env_dict,
            framework=spec.framework or server.framework, files=dict(spec.files))
    except CONFIG_ERRORS as exc:
        return f"the server argv cannot be read: {exc}"
    return config if calibration is None else calibration.apply(config)
