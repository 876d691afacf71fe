"""Shared fixtures: the real simulator started as a subprocess on a free 127.0.0.1 port."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_inferbench.sim.server.launcher import SimServer, launch

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from pathlib import Path

MODEL = "amd/MiniMax-M3-MXFP4"
# The ATOM MiniMax-M3 server argv of benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml (issue 2,
# item 5); the port is the simulator's own choice (--port 0 from the launcher).
ATOM_ARGV = (
    "python3", "-m", "atom.entrypoints.openai_server", "--model", MODEL, "--server-port", "8888",
    "-tp", "4", "--block-size", "128", "--gpu-memory-utilization", "0.8", "--max-model-len",
    "32768", "--max-num-batched-tokens", "32768", "--max-num-seqs", "256", "--kv_cache_dtype",
    "fp8", "--trust-remote-code", "--no-enable_prefix_caching",
)
EAGLE3_ARGS = ("--method", "eagle3", "--draft-model", "Inferact/MiniMax-M3-EAGLE3",
               "--num-speculative-tokens", "3")
ATOM_MTP_ARGV = ATOM_ARGV + EAGLE3_ARGS
FAST = ("--hardware", "MI355X", "--time-scale", "0")


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., SimServer]]:
    """start_server(argv, options, wait=True) -> a running simulator, stopped after the test."""
    started: list[SimServer] = []

    def start(argv: Sequence[str] = ATOM_MTP_ARGV, options: Sequence[str] = FAST,
              wait: bool = True) -> SimServer:
        server = launch(argv, options, log_dir=tmp_path)
        started.append(server)
        if wait:
            server.wait_healthy(timeout_s=60)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def mtp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """One fast ATOM + EAGLE3 simulator shared by a module's functional tests."""
    server = launch(ATOM_MTP_ARGV, FAST, log_dir=tmp_path_factory.mktemp("sim"))
    try:
        server.wait_healthy(timeout_s=60)
        yield server
    finally:
        server.stop()
