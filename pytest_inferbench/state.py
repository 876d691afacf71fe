"""Per-session plugin state, kept in the config stash (never in module globals)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from .backends.base import LoadSettings, StartContext
from .options import Settings
from .xdist_hooks import worker_settings


@dataclass
class SessionState:
    settings: Settings
    run_id: str
    start_context: StartContext
    load: LoadSettings


STATE_KEY = pytest.StashKey[SessionState]()
# The result record of a benchmark item, kept on the item for its report.
RESULT_KEY = pytest.StashKey[dict[str, Any]]()


def create_session_state(config: pytest.Config) -> SessionState:
    workerinput: dict[str, Any] = getattr(config, "workerinput", {})
    settings = worker_settings(Settings.from_config(config), workerinput)
    # Workers share the controller's run id so container labels identify the whole run.
    run_id = str(workerinput.get("inferbench_run_id") or uuid.uuid4().hex[:12])
    worker = str(workerinput.get("workerid", "master"))
    state = SessionState(
        settings=settings,
        run_id=run_id,
        start_context=StartContext(results_dir=settings.results_dir, run_id=run_id,
                                   worker_id=worker, options=settings),
        load=LoadSettings(prompts_per_conc=settings.prompts_per_conc, seed=settings.seed,
                          request_rate=settings.request_rate, range_ratio=settings.range_ratio,
                          warmup=settings.warmup),
    )
    config.stash[STATE_KEY] = state
    return state


def get_session_state(config: pytest.Config) -> SessionState:
    return config.stash[STATE_KEY]
