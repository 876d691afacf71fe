"""Command line: splitting simulator options from the server argv, ports, clear usage errors."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx
import pytest

from pytest_inferbench.sim.server.cli import argv_port, flag_values, split_argv
from pytest_inferbench.sim.server.launcher import running_sim_server, start_sim_server

from .conftest import ATOM_ARGV, MODEL

SERVE = [sys.executable, "-m", "pytest_inferbench.sim", "serve"]


def test_options_end_at_the_first_server_word() -> None:
    sim, server = split_argv(["--time-scale", "0", "--never-ready", "--seed=3", "vllm", "serve",
                              "M", "--port", "9"])
    assert sim == ["--time-scale", "0", "--never-ready", "--seed=3"]
    assert server == ["vllm", "serve", "M", "--port", "9"]


def test_double_dash_separates_even_flag_first_argv() -> None:
    sim, server = split_argv(["--hardware", "H200", "--", "--port", "1", "--model", "M"])
    assert (sim, server) == (["--hardware", "H200"], ["--port", "1", "--model", "M"])


def test_port_and_names_come_from_the_server_argv() -> None:
    assert argv_port(["python3", "-m", "atom.x", "--server-port", "8891"]) == 8891
    assert argv_port(["vllm", "serve", "M", "--port=9000"]) == 9000
    assert argv_port(["vllm", "serve", "M"]) == 8000
    assert flag_values(["vllm", "serve", "M", "--served-model-name", "a", "b", "--tp", "2"],
                       "--served-model-name") == ["a", "b"]


@pytest.mark.parametrize(("words", "message"), [
    (["--hardware", "TPU9", "--", *ATOM_ARGV], "unknown hardware 'TPU9'"),
    (["--error-rate", "1.5", "--", *ATOM_ARGV], "--error-rate 1.5"),
    (["--eval-accuracy", "2", "--", *ATOM_ARGV], "--eval-accuracy 2"),
    (["--time-scale", "0"], "no server argv"),
    (["--", "vllm", "serve", "no/such-model"], "no/such-model"),
    (["--eval-oracle", "/nonexistent/gsm8k.jsonl", "--", *ATOM_ARGV], "cannot read"),
])
def test_bad_input_is_a_usage_error_without_traceback(words: list[str], message: str) -> None:
    done = subprocess.run([*SERVE, *words], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_exits_zero_with_the_usage(flag: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest_inferbench.sim", flag],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "python -m pytest_inferbench.sim serve" in done.stdout


def test_no_subcommand_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest_inferbench.sim"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "usage:" in done.stderr


def test_busy_port_is_a_start_failure() -> None:
    """Valid options, a port someone else holds: one line and status 1 (not a usage error)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run([*SERVE, "--port", str(port), "--", *ATOM_ARGV],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert f"error: cannot listen on 127.0.0.1:{port}:" in line


def test_model_is_served_under_the_name_the_argv_gives() -> None:
    argv = ["vllm", "serve", MODEL.lower(), "--port", "1"]
    with running_sim_server(argv, ["--time-scale", "0"]) as server:
        models = httpx.get(server.base_url + "/v1/models").json()["data"]
    assert [m["id"] for m in models] == [MODEL.lower()]


def test_help_and_usage() -> None:
    helped = subprocess.run([*SERVE, "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "--stall-after-tokens" in helped.stdout
    bare = subprocess.run(SERVE[:-1], capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and "usage:" in bare.stderr


def test_launcher_helpers_start_and_stop_the_server() -> None:
    base_url, process = start_sim_server(ATOM_ARGV, ["--time-scale", "0"])
    try:
        assert base_url.startswith("http://127.0.0.1:")
        assert process.poll() is None
    finally:
        process.terminate()
        assert process.wait(10) is not None
    with running_sim_server(ATOM_ARGV, ["--time-scale", "0"]) as server:
        models = httpx.get(server.base_url + "/v1/models").json()["data"]
        assert models[0]["id"] == MODEL
    assert server.process.poll() is not None
