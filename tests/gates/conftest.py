"""Real recipe, launch-spec and settings objects for the gate tests."""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path

import pytest

from pytest_inferbench.options import Settings
from pytest_inferbench.recipe.launch import ClientOptions, ServerSpec
from pytest_inferbench.recipe.model import BenchPoint, Parallelism, SeqLenSweep, ServerConfig


def make_server(
    config_key: str = "minimaxm3-fp4-mi355x-atom", spec_decoding: str = "none"
) -> ServerConfig:
    return ServerConfig(
        config_key=config_key,
        image="rocm/atom:test",
        model="MiniMaxAI/MiniMax-M3",
        model_prefix="minimaxm3",
        runner="mi355x",
        hardware="MI355X",
        precision="fp4",
        framework="atom",
        multinode=False,
        disagg=False,
        parallel=Parallelism(tp=4),
        spec_decoding=spec_decoding,
        sweeps=(SeqLenSweep(8192, 1024, (4, 64), 7),),
        source=Path("benchmarks/amd-master.yaml"),
        line=3,
    )


def make_point(conc: int = 64, **server_kwargs: str) -> BenchPoint:
    return BenchPoint(server=make_server(**server_kwargs), isl=8192, osl=1024, conc=conc, line=7)


def make_spec(
    argv: tuple[str, ...] = (), env: tuple[tuple[str, str], ...] = (), chat: bool = True
) -> ServerSpec:
    return ServerSpec(
        image="rocm/atom:test",
        argv=("python3", "-m", "atom.entrypoints.openai_server", *argv),
        env=env,
        port=8000,
        health_path="/health",
        startup_timeout_s=60.0,
        gpu_count=4,
        served_model="MiniMaxAI/MiniMax-M3",
        hardware="MI355X",
        framework="atom",
        client=ClientOptions(
            use_chat_template=chat, endpoint="/v1/chat/completions" if chat else "/v1/completions"
        ),
        launch_file=Path("benchmarks/launch/minimaxm3_fp4_mi355x_atom_mtp.yaml"),
    )


def make_settings(**overrides: object) -> Settings:
    base = Settings(
        backend="sim",
        results_dir=Path("inferbench-results"),
        recipe_globs=("*-master.yaml",),
        prompts_per_conc=10,
        request_rate=float("inf"),
        seed=0,
        time_scale=1.0,
        base_url=None,
        launch_dir=None,
        startup_timeout_s=None,
        docker_host=None,
        docker_hosts=(),
        gpus=None,
        process_prefix=(),
        pass_env=(),
        skip_pull=False,
        gates_file=None,
        baseline=None,
        save_baseline=None,
        max_failure_ratio=0.0,
        eval_data=None,
        eval_required=False,
        eval_runner="builtin",
        eval_limit=None,
        pr_number=None,
        changelog_base="origin/main",
        plots=False,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def make_result(point: BenchPoint, **values: object) -> dict[str, object]:
    """A result with the identity fields build_result writes, plus the given metrics."""
    s = point.server
    result: dict[str, object] = {
        "config_key": s.config_key,
        "infmax_model_prefix": s.model_prefix,
        "hw": s.runner,
        "framework": s.framework,
        "precision": s.precision,
        "tp": s.parallel.tp,
        "ep": s.parallel.ep,
        "dp_attention": "false",
        "spec_decoding": s.spec_decoding,
        "isl": point.isl,
        "osl": point.osl,
        "conc": point.conc,
        "num_prompts": 10 * point.conc,
        "completed": 10 * point.conc,
        "failed": 0,
    }
    result.update(values)
    return result


# Captured while this module is being imported: every conftest of the suite is imported under
# the name "conftest", so sys.modules["conftest"] later points at whichever came last.
_THIS_MODULE = sys.modules[__name__]


@pytest.fixture
def objs() -> types.ModuleType:
    """These builders, for tests (the importlib import mode keeps conftest off sys.path)."""
    return _THIS_MODULE
