"""The real simulated server (ATOM persona, MiniMax-M3 on MI355X) for the client tests."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_inferbench.recipe.launch import ClientOptions, ServerSpec
from pytest_inferbench.recipe.model import Parallelism, SeqLenSweep, ServerConfig
from pytest_inferbench.sim.server.launcher import running_sim_server

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pytest_inferbench.sim.server.launcher import SimServer

MODEL = "amd/MiniMax-M3-MXFP4"
ATOM_ARGV = ("python3", "-m", "atom.entrypoints.openai_server", "--model", MODEL,
             "--server-port", "8888", "-tp", "4", "--block-size", "128",
             "--max-model-len", "32768", "--max-num-batched-tokens", "32768",
             "--max-num-seqs", "256", "--kv_cache_dtype", "fp8")
EAGLE3 = ("--method", "eagle3", "--draft-model", "Inferact/MiniMax-M3-EAGLE3",
          "--num-speculative-tokens", "3")


def spec_for(argv: tuple[str, ...], *, chat_template: bool) -> ServerSpec:
    return ServerSpec(
        image="sim", argv=argv, env=(), port=0, health_path="/health", startup_timeout_s=30,
        gpu_count=4, served_model=MODEL, hardware="MI355X", framework="atom",
        client=ClientOptions(use_chat_template=chat_template), launch_file=Path("sim.yaml"))


def server_config(spec_decoding: str, isl: int, osl: int, conc: int) -> ServerConfig:
    return ServerConfig(
        config_key="minimaxm3-fp4-mi355x-atom", image="sim", model=MODEL,
        model_prefix="minimaxm3", runner="mi355x", hardware="MI355X", precision="fp4",
        framework="atom", multinode=False, disagg=False, parallel=Parallelism(tp=4),
        spec_decoding=spec_decoding, sweeps=(SeqLenSweep(isl, osl, (conc,), 1),),
        source=Path("loadgen-test.yaml"), line=1)


@pytest.fixture(scope="module")
def eagle_server() -> Iterator[SimServer]:
    """Real time (time scale 1), EAGLE3 with k=3."""
    with running_sim_server((*ATOM_ARGV, *EAGLE3), ["--time-scale", "1"]) as server:
        yield server


@pytest.fixture(scope="module")
def fast_server() -> Iterator[SimServer]:
    """As fast as possible (time scale 0): functional checks."""
    with running_sim_server((*ATOM_ARGV, *EAGLE3), ["--time-scale", "0"]) as server:
        yield server


# Captured while this module is being imported: every conftest of the suite is imported under
# the name "conftest", so sys.modules["conftest"] later points at whichever came last.
_THIS_MODULE = sys.modules[__name__]


@pytest.fixture
def helpers() -> types.ModuleType:
    """This module's builders, for tests (conftest modules are not importable by name)."""
    return _THIS_MODULE
