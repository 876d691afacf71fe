"""The default backend: the simulated engine in process, on a virtual clock.

`start()` reads the launch spec's argv (what the real server would get) and the recipe runner's
GPU into an `EngineConfig`, so a bad argv, an unknown model or weights that do not fit fail the
server node's setup with a clear message. Every point runs on a fresh engine seeded from the
load seed, so a point's numbers do not depend on which points ran before it; an agentic-coding
point replays its traces on the virtual clock under the HTTP replay's schedule. Results are
simulated predictions and say so (`simulated=True` and a note), each with the simulator's
expected error in its regime (`sim.expected_error`). With `--inferbench-sim-calibration`, a
single-node server the file has an entry for runs on its knobs, its points say so in a note and
carry the calibration's leave-one-out error instead (`sim.calibrate`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from ..loadgen.prompts import point_workload
from ..loadgen.replay_config import replay_config
from ..recipe.agentic import SCENARIO as AGENTIC_SCENARIO
from ..recipe.agentic import drop_flags, offload_launch
from ..results.measurement import SIMULATED_NOTE, PointMeasurement
from ..results.power import SIMULATED_SOURCE, PowerReading
from ..sim import catalog, expected_error, power
from ..sim.acceptance import SpecConfigError
from ..sim.args import ArgvError, engine_config_from_argv
from ..sim.calibrate import file as calibration_file
from ..sim.cluster import Cluster
from ..sim.cluster_driver import simulate_deployment_point
from ..sim.cluster_replay import simulate_cluster_replay
from ..sim.config import EngineConfig
from ..sim.disagg import (
    Deployment,
    DeploymentError,
    Pool,
    default_router,
    engine_framework,
    router_policy_of_argv,
)
from ..sim.driver import server_metrics, simulate_point
from ..sim.engine import Engine, RequestRejectedError
from ..sim.physics import EngineConfigError
from ..sim.replay_driver import SimulatedReplay, simulate_replay
from .agentic_traces import replay_meta, replay_note, replay_traces, replay_workload
from .base import Backend, PointNotMeasuredError, ServerHandle, ServerStartError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..loadgen.progress import ProgressOutput
    from ..options import Settings
    from ..recipe.launch import ClientOptions, ServerSpec
    from ..recipe.model import BenchPoint, ServerConfig
    from ..results.record import JSONValue
    from .base import LoadSettings, StartContext

CONFIG_ERRORS = (ArgvError, catalog.CatalogError, DeploymentError, EngineConfigError,
                 SpecConfigError, ValueError)


class SimHandle(ServerHandle):
    base_url = None

    def __init__(self, name: str, config: EngineConfig, ignored: list[str],
                 client: ClientOptions, deployment: Deployment | None = None,
                 calibration: calibration_file.Calibration | None = None) -> None:
        self.name = name
        self.config = config
        self.deployment = deployment  # a multinode server: its pools, router and transfer
        self.client = client  # the launch spec's client options shape the workload
        self.ignored = ignored
        self.calibration = calibration
        self._notes_given = False
        self._log: list[str] = [f"{name}: {SIMULATED_NOTE}", f"engine config: {config}"]
        if calibration is not None:
            self._log.append(calibration.note(config))
        if deployment is not None:
            self._log.append(f"deployment {deployment.topology}, router {deployment.router}: "
                             + "; ".join(f"{p.role} {p.config}" for p in deployment.pools))
        if ignored:
            self._log.append("ignored by the simulator: " + " ".join(ignored))

    def run_point(self, point: BenchPoint, load: LoadSettings,
                  progress: ProgressOutput | None = None) -> PointMeasurement:
        if point.server.scenario == AGENTIC_SCENARIO:
            return self._run_replay(point, load)
        # Milliseconds of wall time per point: the point's line when it ends is all the progress
        # it needs (`report.live`).
        config = self.config
        if config.seed != load.seed:
            config = replace(config, seed=load.seed)
        # The HTTP client's workload for a simulated server (no tokenizer: words are its tokens).
        workload = point_workload(point.isl, point.osl, point.conc, load, self.client,
                                  prompts=point.prompts)
        num = len(workload.requests)
        started = time.time()
        engine: Engine | None = None
        try:
            if self.deployment is not None:
                outcome = simulate_deployment_point(self.deployment, workload, seed=load.seed)
            else:
                engine = Engine(config, keep_traces=True)
                outcome = simulate_point(config, workload, engine=engine)
        except RequestRejectedError as exc:
            # A real server answers such a request with HTTP 400 and serves the rest; the
            # batch simulator cannot leave one out of its plan, so the point says why instead.
            raise PointNotMeasuredError(
                f"{point.name}: the simulated server rejects a request of this point (a real "
                f"server answers it with HTTP 400): {exc}") from None
        notes = [SIMULATED_NOTE]
        if self.calibration is not None:
            notes.append(self.calibration.note(self.config))
        if self.ignored and not self._notes_given:
            notes.append("ignored by the simulator: " + " ".join(self.ignored))
        self._notes_given = True
        self._log.append(f"{point.name}: {len(outcome.records)} requests in "
                         f"{outcome.duration_s:.1f} virtual s")
        expected, label = point_expected_error(self.config, self.calibration, point,
                                               multinode=self.deployment is not None)
        return PointMeasurement(
            records=outcome.records, duration_s=outcome.duration_s, num_prompts=num,
            max_concurrency=point.conc, simulated=True, server_metrics=outcome.server_metrics,
            notes=tuple(notes), started_unix=started,
            workload={**workload.describe(), "token_source": "words"},
            expected_error=expected, expected_error_label=label,
            power=self._power(point, engine, outcome.busy_s, outcome.server_metrics,
                              outcome.duration_s))

    def _power(self, point: BenchPoint, engine: Engine | None, busy_s: float,
               counters: Mapping[str, JSONValue], duration_s: float) -> PowerReading:
        """Each GPU's mean power by the simulator's power model (`sim.power`) over a measured
        phase of `duration_s` whose steps ran `busy_s` and moved the `counters`' deltas."""
        if engine is None:
            return PowerReading.missing(SIMULATED_SOURCE, "the simulator's power model covers "
                                        "single-node servers, not multinode deployments")
        try:
            figures = power.gpu_power(self.config.hardware)
        except catalog.CatalogError as exc:  # a GPU without power figures: no number made up
            return PowerReading.missing(SIMULATED_SOURCE, str(exc))
        work = power.step_work(engine.cost, busy_s, counters)
        watts = power.mean_power_w(figures, work, duration_s)
        return PowerReading(SIMULATED_SOURCE, avg_power_w=watts, num_gpus=point.server.gpus)

    def _run_replay(self, point: BenchPoint, load: LoadSettings) -> PointMeasurement:
        """An agentic-coding point: its traces replayed on the engine's virtual clock, as the
        HTTP replay plays them (`sim/replay_driver.py`; a multinode deployment's router,
        instances and KV transfers: `sim/cluster_replay.py`), recorded gaps as recorded."""
        config = self.config if self.config.seed == load.seed else replace(
            self.config, seed=load.seed)
        label, trees = replay_traces(load.traces)
        settings = replay_config(load)
        started = time.time()
        engine: Engine | None = None  # the one engine of a single-node server
        try:
            if self.deployment is not None:  # its router, instances and KV transfers
                outcome = simulate_cluster_replay(self.deployment, trees, point.conc, settings,
                                                  chat=self.client.chat, seed=load.seed)
            else:
                engine = Engine(config, keep_traces=True)
                outcome = simulate_replay(engine, trees, point.conc, settings,
                                          chat=self.client.chat)
        except RequestRejectedError as exc:
            raise PointNotMeasuredError(
                f"{point.name}: the simulated server rejects the replay's requests (a real "
                f"server answers them with HTTP 400): {exc}") from None
        notes = [replay_note(label, settings, point.conc), SIMULATED_NOTE]
        if self.ignored and not self._notes_given:
            notes.append("ignored by the simulator: " + " ".join(self.ignored))
        self._notes_given = True
        self._log.append(f"{point.name}: {len(outcome.records)} replayed requests in "
                         f"{outcome.duration_s:.1f} virtual s")
        return PointMeasurement(
            records=outcome.records, duration_s=outcome.duration_s - outcome.profile_start,
            num_prompts=len(outcome.records), max_concurrency=point.conc, simulated=True,
            server_metrics=outcome.server_metrics, notes=tuple(notes), started_unix=started,
            workload=replay_workload(label, trees, point.conc, settings, outcome.requests,
                                     outcome.plays, outcome.plays_completed, "words"),
            # The records' virtual clock starts at 0 when the replay starts.
            replay=replay_meta(point.server.gpus, settings, outcome.requests, clock_start=0.0,
                               start_unix=started),
            # Over the measured phase only, as its duration and token counts: the warmup's
            # steps are left out with its requests.
            power=self._replay_power(point, engine, outcome))

    def _replay_power(self, point: BenchPoint, engine: Engine | None,
                      outcome: SimulatedReplay) -> PowerReading:
        """A replay's power over its measured phase only, as its duration and token counts:
        the warmup's steps are left out with its requests. A deployment has no engine here,
        and `_power` says why it has no figure."""
        if engine is None or outcome.profile_counters is None:
            return self._power(point, None, 0.0, {}, 0.0)
        measured = server_metrics(outcome.profile_counters, engine.counters(), engine)
        return self._power(point, engine, outcome.profile_busy_s, measured,
                           outcome.duration_s - outcome.profile_start)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self._log[-lines:])

    def stop(self) -> None:
        """Nothing to release: the engine lives only during run_point."""


def point_expected_error(config: EngineConfig, calibration: calibration_file.Calibration | None,
                         point: BenchPoint, *, multinode: bool = False
                         ) -> tuple[dict[str, JSONValue], str]:
    """How far off a simulated point's prediction is expected to be, and the line that shows
    it: the published points of its regime (`sim.expected_error`), or for a calibrated single
    node its calibration's own leave-one-out figures. The in-process engine and the simulated
    HTTP server (`simserver`) ask this one function."""
    entry = calibration.entry_for(config) if calibration is not None and not multinode else None
    if entry is not None and config.calibration is not None:
        expected = calibration_file.expected_error(entry, config.calibration)
    else:
        expected = expected_error.expected_error(expected_error.regime(
            config, point.isl, point.osl, point.conc, multinode=multinode))
    return expected, expected_error.label(expected)


def load_calibration(settings: Settings | None) -> calibration_file.Calibration | None:
    """The run's calibration file (`--inferbench-sim-calibration`), or None; a file that
    cannot be used is a `CalibrationFileError` naming it and the line."""
    # Scripts and tests that start the backend alone give no settings (options=None).
    path = settings.sim_calibration if settings is not None else None
    return None if path is None else calibration_file.load(path)


def calibration_problem(settings: Settings) -> str | None:
    """Why the run's calibration file cannot be used, or None (preflight asks before any
    server starts)."""
    try:
        load_calibration(settings)
    except calibration_file.CalibrationFileError as exc:
        return f"--inferbench-sim-calibration: {exc}"
    return None


class SimBackend(Backend):
    name = "sim"
    supports_files = True  # the engine reads TensorRT-LLM's options YAML from the spec
    supports_roles = True  # the prefill and decode roles of a multinode server

    def start(self, server: ServerConfig, spec: ServerSpec,
              ctx: StartContext) -> SimHandle:
        if spec.roles:
            return self._start_deployment(server, spec)
        try:
            config, ignored = engine_config_from_argv(
                spec.argv_for_port(spec.port), hardware=server.hardware, env=spec.env_dict,
                framework=spec.framework or server.framework, files=dict(spec.files))
            calibration = load_calibration(ctx.options)
            if calibration is not None:
                config = calibration.apply(config)
            Engine(config)  # weights that do not fit, unknown dtypes: fail at setup
        except CONFIG_ERRORS as exc:
            raise ServerStartError(f"{server.node_name}: simulator cannot start "
                                   f"({spec.launch_file}): {exc}") from None
        return SimHandle(server.node_name, config, ignored, spec.client,
                         calibration=calibration)

    def _start_deployment(self, server: ServerConfig, spec: ServerSpec) -> SimHandle:
        """A multinode server: one engine config per worker pool from its role's argv, the
        router's policy from the serving role's argv (else the framework's default)."""
        fail = f"{server.node_name}: simulator cannot start ({spec.launch_file})"
        roles = {role.name: role for role in spec.roles}
        if server.prefill is None or server.decode is None or "prefill" not in roles:
            raise ServerStartError(f"{fail}: the sim backend runs the prefill and decode roles "
                                   "of multinode entries; this server's roles are "
                                   f"{', '.join(roles)}")
        pools: list[Pool] = []
        ignored: list[str] = []
        try:
            # A dram point's prompt-computing workers offload their KV to CPU DRAM (InferenceX
            # budgets total-cpu-dram-gb per prefill worker: decode keeps no host pool). Flags
            # the registry does not give leave the tier out, and the point's notes say so.
            try:
                offload = offload_launch(replace(server, parallel=server.prefill.parallel))
            except ValueError as exc:
                offload = ([], {}, ())
                ignored.append(f"kv-offloading dram (no CPU-DRAM tier simulated): {exc}")
            for name, worker in (("prefill", server.prefill), ("decode", server.decode)):
                if worker.num_worker == 0:
                    continue
                role = roles[name]
                argv, env = list(role.argv), dict(role.env)
                if name == "prefill" and offload[0]:
                    argv = drop_flags(argv, offload[2]) + offload[0]
                    env.update(offload[1])
                config, skipped = engine_config_from_argv(
                    argv, hardware=server.hardware, env=env,
                    framework=engine_framework(server.framework), files=dict(spec.files))
                p = worker.parallel
                if config.gpus != p.gpus:
                    raise DeploymentError(
                        f"the {name} role's argv runs {config.gpus} GPUs per worker (tp "
                        f"{config.tp}, pp {config.pp}), the recipe's {name} workers have "
                        f"{p.gpus} (tp {p.tp}, ep {p.ep}, pp {p.pp})")
                ignored += [f"{name}: {word}" for word in skipped]
                aggregated = server.decode.num_worker == 0
                pools.append(Pool("aggregated" if aggregated else name, config,
                                  worker.num_worker))
            serving = roles.get(spec.serve_role)
            policy = (router_policy_of_argv(serving.argv) if serving is not None else None)
            deployment = Deployment(pools[0], pools[1] if len(pools) > 1 else None,
                                    router=policy or default_router(server.framework))
            Cluster(deployment)  # weights that do not fit a worker: fail at setup
        except CONFIG_ERRORS as exc:
            raise ServerStartError(f"{fail}: {exc}") from None
        except KeyError as exc:
            raise ServerStartError(f"{fail}: no {exc} role in the launch spec") from None
        return SimHandle(server.node_name, pools[-1].config, ignored, spec.client, deployment)
