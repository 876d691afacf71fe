"""Recipes and launch specs for the server-lifecycle tests (fixtures are in conftest.py)."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import TYPE_CHECKING, Any

from pytest_inferbench.backends.base import StartContext
from pytest_inferbench.backends.reaper import LABEL_RUN
from pytest_inferbench.recipe.launch import resolve
from pytest_inferbench.recipe.schema import load_recipe
from pytest_inferbench.results.point_files import AGG_PREFIX, point_record
from pytest_inferbench.testing import simimage

if TYPE_CHECKING:
    from pathlib import Path

    from pytest_inferbench.recipe.launch import ServerSpec
    from pytest_inferbench.recipe.model import ServerConfig

MODEL = "amd/MiniMax-M3-MXFP4"

RECIPE = """\
minimaxm3-{precision}-mi355x-atom:
  image: {image}
  model: {model}
  model-prefix: minimaxm3
  runner: mi355x
  precision: {precision}
  framework: atom
  multinode: false
  scenarios:
    fixed-seq-len:
      - isl: 128
        osl: {osl}
        search-space:
{rows}
"""

# The simulator's `serve` command in front of the real ATOM argv: the docker and process
# backends run this exactly as they would run ATOM.
LAUNCH = """\
command: [{command}]
args: [python3, -m, atom.entrypoints.openai_server, --model, "{{model}}", --server-port,
       "{{port}}", -tp, "{{tp}}", --max-model-len, "4096"]
env: {{ INFERBENCH_TEST_ENV: visible }}
health-path: /health
startup-timeout: {timeout}
"""

# Prints HF_TOKEN to the server's log, then becomes the simulator: argv words, no shell.
LEAKY_PREFIX = ('"python3", "-c", "import os, sys; print(\'token\', os.environ[\'HF_TOKEN\'], '
                'flush=True); os.execvp(sys.argv[1], sys.argv[1:])", ')


def sim_command(python: str = "python3", sim_options: tuple[str, ...] = ()) -> str:
    words = [python, "-m", "pytest_inferbench.sim", "serve", "--hardware", "MI355X",
             "--time-scale", "0", *sim_options, "--"]
    return ", ".join(f'"{w}"' for w in words)


def write_recipe(directory: Path, *, image: str = simimage.IMAGE, model: str = MODEL,
                 tps: tuple[int, ...] = (1,), precisions: tuple[str, ...] = ("fp4",),
                 sim_options: dict[str, tuple[str, ...]] | None = None,
                 command: str | None = None, leak_token: bool = False, timeout: float = 60,
                 osl: int = 16, python: str = "python3") -> Path:
    """A master config (its name matches the default glob) and one launch spec per precision:
    one server node per (precision, tp), concurrencies 1 and 2 each."""
    rows = "\n".join(f"          - {{ tp: {tp}, conc-start: 1, conc-end: 2 }}" for tp in tps)
    recipe = directory / "test-master.yaml"
    recipe.write_text("\n".join(
        RECIPE.format(precision=p, image=image, model=json.dumps(model), osl=osl, rows=rows)
        for p in precisions))
    launch = directory / "launch"
    launch.mkdir(exist_ok=True)
    for precision in precisions:
        words = command or sim_command(python, (sim_options or {}).get(precision, ()))
        (launch / f"minimaxm3_{precision}_mi355x_atom.yaml").write_text(LAUNCH.format(
            command=(LEAKY_PREFIX if leak_token else "") + words, timeout=timeout))
    return recipe


AGENTIC_RECIPE = """\
minimaxm3-fp4-mi355x-atom-agentic:
  image: {image}
  model: {model}
  model-prefix: minimaxm3
  runner: cluster:mi355x-amds
  precision: fp4
  framework: atom
  multinode: false
  scenarios:
    agentic-coding:
    - search-space:
      - {{ tp: 1, kv-offloading: none, conc-list: [2] }}
"""
# ATOM's argv as a fixed-seq-len spec has it: a context sized from ISL/OSL, no prefix cache.
AGENTIC_LAUNCH = """\
command: [{prefix}python3, -m, atom.entrypoints.openai_server]
args: [--model, "{{model}}", --server-port, "{{port}}", -tp, "{{tp}}",
       --max-model-len, "{{max_model_len}}", --no-enable-prefix-caching]
health-path: /health
startup-timeout: 60
"""


def write_agentic_recipe(directory: Path, sim: str | None = None, *,
                         image: str = simimage.IMAGE) -> Path:
    """An agentic-coding entry (one point, conc 2) and its launch spec: ATOM's argv, after
    `sim` (the simulator's `serve ... --` words) unless the backend puts the simulator there."""
    recipe = directory / "test-master.yaml"
    recipe.write_text(AGENTIC_RECIPE.format(image=image, model=json.dumps(MODEL)))
    launch = directory / "launch"
    launch.mkdir(exist_ok=True)
    (launch / "minimaxm3_fp4_mi355x_atom.yaml").write_text(AGENTIC_LAUNCH.format(
        prefix=f"{sim}, " if sim else ""))
    return recipe


def agentic_point(results: Path) -> dict[str, object]:
    """The one raw point file of a run of `write_agentic_recipe`, flattened."""
    (raw,) = [p for p in (results / "points").glob("*.json") if not p.name.startswith(AGG_PREFIX)]
    return point_record(json.loads(raw.read_text()))


def assert_replayed_on_an_agentic_server(point: dict[str, object], backend: str) -> None:
    """The point replayed traces against its server, all of them answered, and the server ran
    with the agentic argv: the spec's ISL/OSL-sized context and prefix-cache switch left out."""
    assert point["backend"] == backend and point["exp_name"] == "minimaxm3_tp1_conc2_kvnone"
    workload = point["workload"]
    assert isinstance(workload, dict) and workload["kind"] == "agentic-replay"
    assert point["completed"] == point["num_prompts"] > 0  # type: ignore[operator]
    argv = point["server_argv"]
    assert isinstance(argv, list) and "atom.entrypoints.openai_server" in argv
    assert "--max-model-len" not in argv and "--no-enable-prefix-caching" not in argv


def load_node(recipe: Path, index: int = 0) -> tuple[ServerConfig, ServerSpec]:
    server = load_recipe(recipe).servers[index]
    return server, resolve(server, recipe.parent / "launch")


def with_settings(ctx: StartContext, **changes: Any) -> StartContext:
    return dataclasses.replace(ctx, options=dataclasses.replace(ctx.options, **changes))


def containers_of_run(client: Any, run_id: str) -> list[Any]:
    return list(client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"}))


def assert_never_ready_message(message: str, timeout_s: int) -> None:
    """The timeout, the last health answer and the log tail are all in the message. The last
    answer is the 503 of a server still loading -- or, on a machine so loaded that the server
    was not serving yet, a refused or timed-out connection."""
    head, _, tail = message.partition("--- last log lines ---")
    assert f"not ready after {timeout_s}s (last health check http://127.0.0.1:" in head, message
    assert re.search(r"/health: (HTTP 503|ConnectError|ReadTimeout)", head), message
    assert tail.strip(), message


def slurm_jobs() -> list[tuple[str, str, str, str]]:
    """(id, name, state, comment) of every job in squeue."""
    import subprocess

    out = subprocess.run(["squeue", "--noheader", "--format=%i|%j|%T|%k"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return [tuple(line.split("|", 3)) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


def jobs_of_run(run_id: str) -> list[str]:
    """Ids of the jobs in squeue whose name carries this run id (the backend's job names)."""
    return [job_id for job_id, name, _, _ in slurm_jobs() if f"-{run_id}-" in name]


def cancel_jobs(job_ids: list[str]) -> None:
    import subprocess

    subprocess.run(["scancel", *job_ids], timeout=30, check=False)
