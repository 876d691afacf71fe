"""Per-session plugin state, kept in the config stash (never in module globals)."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from .backends.base import MAIN_WORKER, LoadSettings, StartContext
from .options import Settings
from .results.record import PointRecord
from .results.redact import Redactor

if TYPE_CHECKING:
    from collections.abc import Mapping

# What an xdist controller hands each worker (`xdist_hooks.worker_input`).
RUN_ID_KEY = "inferbench_run_id"
GPUS_KEY = "inferbench_gpus"
DOCKER_HOST_KEY = "inferbench_docker_host"


@dataclass
class SessionState:
    settings: Settings
    run_id: str
    start_context: StartContext
    load: LoadSettings
    # Every secret value of the run: what servers receive and credentials in the base URL.
    redactor: Redactor = field(default_factory=Redactor)


STATE_KEY = pytest.StashKey[SessionState]()
# The result records of an item (one for a recipe point, any number for a Python test), kept
# on the item for its report.
RESULTS_KEY = pytest.StashKey[list[PointRecord]]()
# `--inferbench-changed-since`'s revision, when its selection kept nothing: nothing changed.
NOTHING_CHANGED_KEY = pytest.StashKey[str]()


def create_session_state(config: pytest.Config,
                         settings: Settings | None = None) -> SessionState:
    workerinput: Mapping[str, object] = getattr(config, "workerinput", {})
    settings = worker_settings(settings or Settings.from_config(config), workerinput)
    # Workers share the controller's run id so container labels identify the whole run.
    run_id = str(workerinput.get(RUN_ID_KEY) or uuid.uuid4().hex[:12])
    worker = str(workerinput.get("workerid", MAIN_WORKER))
    state = SessionState(
        settings=settings,
        run_id=run_id,
        start_context=StartContext(results_dir=settings.results_dir, run_id=run_id,
                                   worker_id=worker, options=settings),
        load=LoadSettings(prompts_per_conc=settings.prompts_per_conc, seed=settings.seed,
                          request_rate=settings.request_rate, range_ratio=settings.range_ratio,
                          warmup=settings.warmup, stall_timeout_s=settings.stall_timeout_s,
                          point_timeout_s=settings.point_timeout_s,
                          dataset=settings.dataset, traces=settings.traces,
                          replay_duration_s=settings.replay.duration_s,
                          trajectory_start=settings.replay.trajectory_start,
                          warmup_per_lane=settings.replay.warmup_per_lane),
        redactor=Redactor.from_env(settings.pass_env, urls=(settings.base_url,)),
    )
    config.stash[STATE_KEY] = state
    return state


def worker_settings(settings: Settings, workerinput: Mapping[str, object] | None) -> Settings:
    """The settings a worker runs with: its GPU slice and its Docker Engine."""
    if not workerinput:
        return settings
    if GPUS_KEY in workerinput:
        settings = dataclasses.replace(settings, gpus=str(workerinput[GPUS_KEY]))
    if DOCKER_HOST_KEY in workerinput:
        settings = dataclasses.replace(settings, docker_host=str(workerinput[DOCKER_HOST_KEY]))
    return settings


def get_session_state(config: pytest.Config) -> SessionState:
    return config.stash[STATE_KEY]
