"""The body of a server node's eval item (`eval-gsm8k`, `eval-gpqa`): data check, server,
eval, threshold gate.

Simulated backends: the in-process `sim` backend has no HTTP server, and a `sim-server` node
was started without an answer oracle. So for both, the eval starts its own simulated HTTP
server for the node (same launch-spec argv, time scale 0, `--eval-oracle <the task's data>`) and
stops it afterwards. Its accuracy is `INFERBENCH_SIM_EVAL_ACCURACY` (default 0.937, the ATOM
MiniMax-M3 MXFP4 recipe's measured gsm8k score): the score is then a property of the
simulator's oracle, never of a model, and the item says so.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

import pytest

from ..frameworks.specdecode import read_speculative_decoding
from ..options.backend_registry import backend_info
from ..results.build import WriteError
from .files import finish_eval_dir
from .gsm8k import EvalDataError
from .lm_eval_runner import LmEvalError, run_lm_eval
from .runner import (
    EvalResult,
    eval_job,
    gpqa_job,
    run_gpqa_eval,
    run_gsm8k_eval,
    served_model,
)
from .tasks import TASK_NAMES
from .thresholds import ThresholdsError, check_eval, lookup_threshold, thresholds_path

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from ..backends.base import StartContext
    from ..backends.supervised import SupervisedHandle
    from ..options import Settings
    from ..recipe.launch import ServerSpec
    from ..recipe.model import ServerConfig

SIM_EVAL_ACCURACY = 0.937
ACCURACY_ENV = "INFERBENCH_SIM_EVAL_ACCURACY"


def sim_eval_accuracy() -> float:
    text = os.environ.get(ACCURACY_ENV, "")
    if not text:
        return SIM_EVAL_ACCURACY
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise pytest.UsageError(f"{ACCURACY_ENV}={text!r}: expected a number within [0, 1]")
    return value


def run_eval_item(
    item: pytest.Item,
    server: ServerConfig,
    spec: ServerSpec | None,
    base_url: str | None,
    settings: Settings,
    ctx: StartContext,
    *,
    task: str = "gsm8k",
) -> EvalResult:
    """Skip (no data), or run the task (`gsm8k`, `gpqa`) and fail with one line per filter
    below its threshold."""
    name = TASK_NAMES[task]
    # Identify the row first, so the summary lists the eval even when it skips or fails early.
    item.user_properties += [("eval_node", server.node_name), ("eval_task", name)]
    data = task_data(settings, task)
    if data is None:
        reason = (
            "no GSM8K data: pass --inferbench-eval-data=PATH or set inferbench_eval_data "
            "(a jsonl with 'question' and 'answer')"
        )
        if settings.eval_required:
            pytest.fail(f"{reason}; inferbench_eval_required is set", pytrace=False)
        pytest.skip(reason)
    described = read_speculative_decoding(spec.argv, spec.env_dict) if spec else None
    forced = described.forced_acceptance_length if described else None
    if described is not None and forced is not None:
        # Forced acceptance emits draft tokens that are not the model's: accuracy is meaningless.
        reason = (
            f"the launch spec forces a synthetic acceptance length ({described.forced_by} "
            f"{forced:g}); accuracy evals need real acceptance"
        )
        if settings.eval_required:
            pytest.fail(f"{reason}; inferbench_eval_required is set", pytrace=False)
        pytest.skip(reason)
    try:
        threshold = lookup_threshold(thresholds_path(server, settings.layout), server.model_prefix,
                                     name)
        with _eval_server(server, spec, base_url, settings, ctx, data) as url:
            if task == "gpqa":  # the lm-eval runner writes a GSM8K task only
                result = run_gpqa_eval(url, gpqa_job(server, spec, settings),
                                       settings.results_dir)
            else:
                runner = run_lm_eval if settings.eval_runner == "lm-eval" else run_gsm8k_eval
                result = runner(url, eval_job(server, spec, settings), settings.results_dir)
        finish_eval_dir(server, result, served_model(spec, server), simulated=settings.simulated,
                        runner="builtin" if task == "gpqa" else settings.eval_runner)
    except (EvalDataError, ThresholdsError, LmEvalError, WriteError) as exc:
        # WriteError: a file of the eval that could not be written (a full disk), named.
        failure = str(exc)
    else:
        failure = ""
    if failure:  # failed outside the except clause: the report shows no exception chain
        pytest.fail(failure, pytrace=False)
    item.user_properties.extend(p for p in result.properties() if p[0] != "eval_task")
    item.user_properties.append(("eval_threshold", threshold.value))
    if settings.simulated:
        item.user_properties.append(("simulated", True))
    failures = check_eval(result, threshold)
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)
    return result


def task_data(settings: Settings, task: str) -> Path | None:
    """The data file the user gave for `task`."""
    return settings.eval_data_gpqa if task == "gpqa" else settings.eval_data


@contextlib.contextmanager
def _eval_server(
    server: ServerConfig,
    spec: ServerSpec | None,
    base_url: str | None,
    settings: Settings,
    ctx: StartContext,
    data: Path,
) -> Iterator[str]:
    if not backend_info(settings.backend).simulated:
        if base_url is None:
            pytest.fail(
                f"{server.node_name}: the server has no HTTP address to evaluate", pytrace=False
            )
        yield base_url
        return
    handle = start_oracle_server(server, spec, settings, ctx, data)
    try:
        yield handle.base_url or ""
    finally:
        handle.stop()


def start_oracle_server(
    server: ServerConfig, spec: ServerSpec | None, settings: Settings, ctx: StartContext,
    data: Path | None = None,
) -> SupervisedHandle:
    """The simulated HTTP server for `server`, answering the questions of `data` (GSM8K or
    GPQA; default: the GSM8K data)."""
    from ..backends.base import ServerStartError
    from ..backends.simserver import start_sim_server

    if spec is None:
        pytest.fail(
            f"{server.node_name}: the simulated eval server needs the node's launch spec",
            pytrace=False,
        )
    data = data or settings.eval_data
    assert data is not None
    oracle = ("--eval-oracle", str(data), "--eval-accuracy",
              str(sim_eval_accuracy()), "--seed", str(settings.seed))
    try:
        return start_sim_server(f"{server.node_name}-eval", server.hardware, spec, ctx,
                                time_scale=0.0, simulator_args=oracle)
    except ServerStartError as exc:
        pytest.fail(f"simulated eval server did not start: {exc}", pytrace=False)
