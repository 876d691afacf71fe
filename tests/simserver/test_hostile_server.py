"""The standalone server against hostile clients and command lines: clients that leave (after
the headers, half way through a body, mid-stream at time scale 0), a timeline that would
otherwise grow with every token, and option values it must refuse with its usage."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from pytest_inferbench.sim.server.launcher import launch

from .conftest import ATOM_ARGV, FAST, MODEL
from .promtext import scrape, value

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from pytest_inferbench.sim.server.launcher import SimServer

SERVE = [sys.executable, "-m", "pytest_inferbench.sim", "serve"]
RUNNING = "atom:requests_running"  # the ATOM persona's in-flight gauge
SETTLE_S = 60.0  # generous: how long the server may take to notice clients that left
# Longer than the model allows a prompt of a few tokens, so nothing finishes on its own before
# its client leaves: 30,000 tokens take several seconds at time scale 0.
LONG = 30_000


@pytest.fixture(scope="module")
def fast_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    server = launch(ATOM_ARGV, FAST, log_dir=tmp_path_factory.mktemp("hostile"))
    try:
        server.wait_healthy(timeout_s=60)
        yield server
    finally:
        server.stop()


def connect(server: SimServer) -> socket.socket:
    host, port = server.base_url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def request_head(path: str, framing: str) -> bytes:
    """A POST's head; `framing` is its Content-Length or Transfer-Encoding header."""
    return (f"POST {path} HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
            f"{framing}\r\n\r\n").encode()


def poll(read: Callable[[], float], want: float, deadline_s: float) -> float:
    """Read until it gives `want` or the deadline passes; the last value read."""
    end = time.monotonic() + deadline_s
    while (got := read()) != want and time.monotonic() < end:
        time.sleep(0.05)
    return got


def running(server: SimServer) -> float:
    return value(scrape(server.base_url), RUNNING)


@pytest.mark.parametrize(("path", "stream"), [
    ("/v1/completions", True), ("/v1/chat/completions", True), ("/v1/completions", False)])
def test_clients_that_leave_are_aborted_at_time_scale_0(
        fast_server: SimServer, path: str, stream: bool) -> None:
    """At time scale 0 a stream's next tokens are always ready; the work still stops when the
    client goes, and the engine frees its slots (the running gauge falls to 0)."""
    clients = 8
    httpx.delete(fast_server.base_url + "/debug/inferbench/timeline")
    fields: dict[str, object] = {"model": MODEL, "max_tokens": LONG, "ignore_eos": True,
                                 "stream": stream}
    if path.endswith("chat/completions"):
        fields["messages"] = [{"role": "user", "content": "hi"}]
    else:
        fields["prompt"] = "hi"
    body = json.dumps(fields).encode()
    sockets = []
    try:
        for _ in range(clients):
            sock = connect(fast_server)
            sock.sendall(request_head(path, f"Content-Length: {len(body)}") + body)
            sockets.append(sock)
        # All in the engine (none has read a byte of its answer): now every client leaves.
        assert poll(lambda: running(fast_server), clients, SETTLE_S) == clients
    finally:
        for sock in sockets:
            sock.close()
    assert poll(lambda: running(fast_server), 0, SETTLE_S) == 0
    records = httpx.get(fast_server.base_url + "/debug/inferbench/timeline").json()["requests"]
    assert len(records) == clients
    for record in records:
        assert record["outcome"] == "aborted", record["outcome"]
        assert record["completion_tokens"] < LONG
    assert fast_server.process.poll() is None


@pytest.mark.parametrize("sent", [
    pytest.param(request_head("/v1/completions", "Content-Length: 200") + b'{"model": "',
                 id="half-a-body"),
    pytest.param(request_head("/v1/completions", "Content-Length: 200"), id="headers-only"),
    pytest.param(request_head("/v1/chat/completions", "Transfer-Encoding: chunked")
                 + b'10\r\n{"model"', id="half-a-chunk"),
])
def test_a_client_that_leaves_mid_body_leaves_no_traceback(
        fast_server: SimServer, sent: bytes) -> None:
    logged = len(fast_server.log_path.read_text())
    with connect(fast_server) as sock:
        sock.sendall(sent)
        time.sleep(0.1)  # the server has the partial request before the client goes
    time.sleep(0.3)  # room for the handler to see the disconnect (a slow run only passes)
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
    assert httpx.post(fast_server.base_url + "/v1/completions", json=body).status_code == 200
    new = fast_server.log_path.read_text()[logged:]
    assert "Traceback" not in new
    assert "ERROR" not in new and "internal error" not in new
    assert len(new.strip().splitlines()) <= 1


def test_the_timeline_keeps_the_newest_records_within_its_memory_budget(
        start_server: Callable[..., SimServer]) -> None:
    server = start_server(ATOM_ARGV, (*FAST, "--timeline-mib", "0.25"))
    url = server.base_url

    def complete(tokens: int) -> None:
        body = {"model": MODEL, "prompt": "hi", "max_tokens": tokens, "ignore_eos": True}
        assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 200

    for _ in range(10):
        complete(4)
    short = httpx.get(url + "/debug/inferbench/timeline").json()
    assert len(short["requests"]) == 10 and short["retention"]["dropped"] == 0
    for _ in range(8):
        complete(500)  # one emission per token here (no speculative decoding)
    timeline = httpx.get(url + "/debug/inferbench/timeline").json()
    kept, retention = timeline["requests"], timeline["retention"]
    assert retention["dropped"] > 0
    assert len(kept) + retention["dropped"] == 18
    assert len(kept) < 8  # not even the long records all fit; a count limit keeps all 18
    assert retention["kept_bytes"] <= retention["budget_bytes"] == 0.25 * 2 ** 20
    ids = [r["request_id"] for r in kept]
    assert ids == list(range(18 - len(kept), 18))  # the newest, in order: the oldest went
    httpx.delete(url + "/debug/inferbench/timeline")
    cleared = httpx.get(url + "/debug/inferbench/timeline").json()
    assert cleared["requests"] == [] and cleared["retention"]["dropped"] == 0


@pytest.mark.parametrize("options", [
    ["--time-scale", "inf"], ["--time-scale", "nan"], ["--time-scale", "-1"],
    ["--startup-delay", "inf"], ["--port", "70000"], ["--timeline-mib", "-1"],
], ids=" ".join)
def test_bad_option_values_are_usage_errors(options: list[str]) -> None:
    # `--port 0` first: the option under test, given after it, wins.
    done = subprocess.run([*SERVE, "--port", "0", *options, "--", *ATOM_ARGV],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("usage: python -m pytest_inferbench.sim serve")
    assert f"error: argument {options[0]}: " in done.stderr


def test_an_out_of_range_port_in_the_server_argv_is_a_usage_error() -> None:
    argv = [w if w != "8888" else "70000" for w in ATOM_ARGV]
    done = subprocess.run([*SERVE, "--", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "port '70000' is not a port number" in line


def test_an_unwritable_port_file_is_a_start_failure(tmp_path: Path) -> None:
    port_file = tmp_path / "missing-dir" / "port"
    done = subprocess.run([*SERVE, "--port", "0", "--port-file", str(port_file), "--",
                           *ATOM_ARGV], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"cannot write --port-file {port_file}" in done.stderr
