"""The default backend: the simulated engine in process, on a virtual clock.

`start()` reads the launch spec's argv (what the real server would get) and the recipe runner's
GPU into an `EngineConfig`, so a bad argv, an unknown model or weights that do not fit fail the
server node's setup with a clear message. Every point runs on a fresh engine seeded from the
load seed, so a point's numbers do not depend on which points ran before it. Results are
simulated predictions and say so (`simulated=True` and a note).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from ..loadgen.prompts import point_workload
from ..sim import catalog
from ..sim.args import ArgvError, engine_config_from_argv
from ..sim.config import EngineConfig
from ..sim.driver import simulate_point
from ..sim.engine import Engine
from ..sim.physics import EngineConfigError
from ..sim.spec_decode import SpecConfigError
from .base import Backend, PointMeasurement, ServerHandle, ServerStartError

if TYPE_CHECKING:
    from ..launch import ClientOptions, ServerSpec
    from ..loadgen.progress import ProgressOutput
    from ..recipe import BenchPoint, ServerConfig
    from .base import LoadSettings, StartContext

SIMULATED_NOTE = ("simulated prediction: virtual-time roofline model of the serving engine "
                  "(pytest_inferbench.sim), not a measurement")
CONFIG_ERRORS = (ArgvError, catalog.CatalogError, EngineConfigError, SpecConfigError, ValueError)


class SimHandle(ServerHandle):
    base_url = None

    def __init__(self, name: str, config: EngineConfig, ignored: list[str],
                 client: ClientOptions) -> None:
        self.name = name
        self.config = config
        self.client = client  # the launch spec's client options shape the workload
        self.ignored = ignored
        self._notes_given = False
        self._log: list[str] = [f"{name}: {SIMULATED_NOTE}", f"engine config: {config}"]
        if ignored:
            self._log.append("ignored by the simulator: " + " ".join(ignored))

    def run_point(self, point: BenchPoint, load: LoadSettings,
                  progress: ProgressOutput | None = None) -> PointMeasurement:
        # Seconds per point: the runner's start and end lines are all the progress it needs.
        config = self.config
        if config.seed != load.seed:
            config = replace(config, seed=load.seed)
        # The HTTP client's workload for a simulated server (no tokenizer: words are its tokens).
        workload = point_workload(point.isl, point.osl, point.conc, load, self.client,
                                  prompts=point.prompts)
        num = len(workload.requests)
        started = time.time()
        outcome = simulate_point(config, workload, engine=Engine(config, keep_traces=True))
        notes = [SIMULATED_NOTE]
        if self.ignored and not self._notes_given:
            notes.append("ignored by the simulator: " + " ".join(self.ignored))
        self._notes_given = True
        self._log.append(f"{point.name}: {len(outcome.records)} requests in "
                         f"{outcome.duration_s:.1f} virtual s")
        return PointMeasurement(
            records=outcome.records, duration_s=outcome.duration_s, num_prompts=num,
            max_concurrency=point.conc, simulated=True, server_metrics=outcome.server_metrics,
            notes=tuple(notes), started_unix=started,
            workload={**workload.describe(), "token_source": "words"})

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self._log[-lines:])

    def stop(self) -> None:
        """Nothing to release: the engine lives only during run_point."""


class SimBackend(Backend):
    name = "sim"
    supports_files = True  # the engine reads TensorRT-LLM's options YAML from the spec

    def start(self, server: ServerConfig, spec: ServerSpec,
              ctx: StartContext) -> SimHandle:
        try:
            config, ignored = engine_config_from_argv(
                spec.argv_for_port(spec.port), hardware=server.hardware, env=spec.env_dict,
                framework=spec.framework or server.framework, files=dict(spec.files))
            Engine(config)  # weights that do not fit, unknown dtypes: fail at setup
        except CONFIG_ERRORS as exc:
            raise ServerStartError(f"{server.node_name}: simulator cannot start "
                                   f"({spec.launch_file}): {exc}") from None
        return SimHandle(server.node_name, config, ignored, spec.client)
