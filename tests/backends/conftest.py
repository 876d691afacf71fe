"""Fixtures for the server-lifecycle tests: a real Docker Engine, the simulator image, recipes.

Tests that need Docker skip with the reason when no engine answers; CI starts one
(`/work/shared/scripts/start-dockerd.sh`, loopback only, host networking).
"""

from __future__ import annotations

import dataclasses
import textwrap
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from pytest_inferbench.backends.base import StartContext
from pytest_inferbench.backends.docker import MOUNTS_ENV
from pytest_inferbench.backends.reaper import LABEL_RUN
from pytest_inferbench.launch import resolve
from pytest_inferbench.options import Settings
from pytest_inferbench.schema import load_recipe
from pytest_inferbench.testing import simimage

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pytest_inferbench.launch import ServerSpec
    from pytest_inferbench.recipe import ServerConfig

pytest_plugins = ["pytester"]

MODEL = "amd/MiniMax-M3-MXFP4"

RECIPE = """\
{key}:
  image: {image}
  model: {model}
  model-prefix: minimaxm3
  runner: mi355x
  precision: fp4
  framework: atom
  multinode: false
  scenarios:
    fixed-seq-len:
      - isl: 128
        osl: 16
        search-space:
          - {{ tp: {tp}, conc-start: 1, conc-end: 2 }}
"""

# The simulator's `serve` command in front of the real ATOM argv: the docker and process
# backends run this exactly as they would run ATOM.
LAUNCH = """\
command: [{command}]
args: [python3, -m, atom.entrypoints.openai_server, --model, "{{model}}", --server-port,
       "{{port}}", -tp, "{{tp}}", --max-model-len, "4096"{extra}]
env: {{ INFERBENCH_TEST_ENV: visible }}
health-path: /health
startup-timeout: {timeout}
"""


def sim_command(python: str = "python3", sim_options: tuple[str, ...] = ()) -> str:
    words = [python, "-m", "pytest_inferbench.sim", "serve", "--hardware", "MI355X",
             "--time-scale", "0", *sim_options, "--"]
    return ", ".join(f'"{w}"' for w in words)


def write_recipe(directory: Path, *, keys: tuple[str, ...] = ("minimaxm3-fp4-mi355x-atom",),
                 image: str = simimage.IMAGE, model: str = MODEL, tp: int = 1,
                 command: str | None = None, extra_args: str = "", timeout: float = 60) -> Path:
    """A master config (file name matches the default glob) plus its launch spec."""
    recipe = directory / "test-master.yaml"
    recipe.write_text("\n".join(
        RECIPE.format(key=key, image=image, model=f'"{model}"', tp=tp) for key in keys))
    launch = directory / "launch"
    launch.mkdir(exist_ok=True)
    (launch / "minimaxm3_fp4_mi355x_atom.yaml").write_text(LAUNCH.format(
        command=command or sim_command(), extra=extra_args, timeout=timeout))
    return recipe


def load_node(recipe: Path, index: int = 0) -> tuple[ServerConfig, ServerSpec]:
    server = load_recipe(recipe).servers[index]
    return server, resolve(server, recipe.parent / "launch")


@pytest.fixture
def run_id() -> str:
    return "t" + uuid.uuid4().hex[:11]


@pytest.fixture
def start_context(pytestconfig: pytest.Config, tmp_path: Path, run_id: str) -> StartContext:
    settings = dataclasses.replace(Settings.from_config(pytestconfig), results_dir=tmp_path,
                                   time_scale=0.0, startup_timeout_s=None)
    return StartContext(results_dir=tmp_path, run_id=run_id, worker_id="master",
                        options=settings)


def with_settings(ctx: StartContext, **changes: Any) -> StartContext:
    return dataclasses.replace(ctx, options=dataclasses.replace(ctx.options, **changes))


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker Engine answers ({type(exc).__name__}: {exc}); "
                    "start one with /work/shared/scripts/start-dockerd.sh")
    yield client
    client.close()


@pytest.fixture(scope="session")
def sim_image(docker_client: Any) -> str:
    return simimage.ensure_image(docker_client)


@pytest.fixture
def sim_mounts(monkeypatch: pytest.MonkeyPatch, sim_image: str) -> str:
    monkeypatch.setenv(MOUNTS_ENV, simimage.mounts_value())
    return sim_image


def containers_of_run(client: Any, run_id: str) -> list[Any]:
    return list(client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"}))


@pytest.fixture
def no_leftovers(docker_client: Any, run_id: str) -> Iterator[None]:
    """After the test: `docker ps -a --filter label=inferbench.run=<run>` must be empty."""
    yield
    left = containers_of_run(docker_client, run_id)
    for container in left:
        container.remove(force=True)
    assert not left, f"containers left behind: {[c.name for c in left]}"


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")
