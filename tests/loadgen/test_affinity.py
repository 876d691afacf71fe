"""The client pins itself off the CPUs a local server's processes are bound to.

The servers here are real subprocesses bound the way `taskset` (or vLLM's CPU worker) binds
them, with os.sched_setaffinity; the client is this test process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from pytest_inferbench.loadgen.affinity import loopback_server_group, pinned_to_one_cpu

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs CPU affinity and at least 2 CPUs")

# A server that starts a worker (as vLLM does) and waits; both in the server's process group.
SERVER = ("import subprocess, sys, time; "
          "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
          "print(w.pid, flush=True); time.sleep(60)")


@pytest.fixture
def server() -> Iterator[tuple[int, int]]:
    """(server pid, its worker's pid): a process group of two sleeping processes."""
    process = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE,
                               process_group=0)
    try:
        assert process.stdout is not None
        worker = int(process.stdout.readline())
        yield process.pid, worker
    finally:
        os.killpg(process.pid, 9)
        process.wait()


# A server listening on a loopback port, its worker as above: one started by hand, not by this
# run (the external backend's case); it prints its port and its worker's pid.
LISTENER = ("import socket, subprocess, sys, time; s = socket.socket(); "
            "s.bind(('127.0.0.1', 0)); s.listen(); "
            "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print(s.getsockname()[1], w.pid, flush=True); time.sleep(60)")


@pytest.fixture
def listener() -> Iterator[tuple[int, int, int]]:
    """(leader pid, worker pid, port) of a listening server in a process group of its own."""
    process = subprocess.Popen([sys.executable, "-c", LISTENER], stdout=subprocess.PIPE,
                               process_group=0)
    try:
        assert process.stdout is not None
        port, worker = map(int, process.stdout.readline().split())
        yield process.pid, worker, port
    finally:
        os.killpg(process.pid, 9)
        process.wait()


@pytest.fixture
def affinity() -> Iterator[set[int]]:
    """This process's CPUs, restored after the test."""
    before = os.sched_getaffinity(0)
    yield before
    os.sched_setaffinity(0, before)


def test_the_client_keeps_off_the_cpu_the_server_worker_is_bound_to(
        server: tuple[int, int], affinity: set[int]) -> None:
    leader, worker = server
    bound = min(affinity)
    os.sched_setaffinity(worker, {bound})  # the worker, as vLLM binds it to CPU 0
    # The client runs on that very CPU when the point starts: left to itself it would stay.
    os.sched_setaffinity(0, {bound})
    os.sched_setaffinity(0, affinity)
    with pinned_to_one_cpu(leader) as pinning:
        inside = os.sched_getaffinity(0)
    assert pinning.cpu is not None and pinning.cpu != bound
    assert inside == {pinning.cpu}
    assert pinning.server_cpus == (bound,)
    assert f"off the local server's bound CPUs [{bound}]" in pinning.choice
    assert os.sched_getaffinity(0) == affinity


def test_no_pin_when_the_server_is_bound_to_every_cpu(
        server: tuple[int, int], affinity: set[int]) -> None:
    leader, worker = server
    first, *rest = sorted(affinity)
    os.sched_setaffinity(leader, {first})
    os.sched_setaffinity(worker, set(rest))
    with pinned_to_one_cpu(leader) as pinning:
        inside = os.sched_getaffinity(0)
    assert pinning.cpu is None and inside == affinity
    assert pinning.choice.startswith("not pinned: the local server is bound to CPUs")


def test_an_unbound_server_leaves_the_client_where_it_is(
        server: tuple[int, int], affinity: set[int]) -> None:
    leader, _ = server
    with pinned_to_one_cpu(leader) as pinning:
        assert pinning.cpu is not None and os.sched_getaffinity(0) == {pinning.cpu}
    assert pinning.server_cpus == ()
    assert "bound to no CPU" in pinning.choice


def test_a_server_not_started_by_the_run_is_found_by_its_loopback_port(
        listener: tuple[int, int, int], affinity: set[int]) -> None:
    """An external server on this host (vLLM started by hand, its worker bound to a CPU): the
    client keeps off that CPU as it does for a server the run started."""
    leader, worker, port = listener
    bound = min(affinity)
    os.sched_setaffinity(worker, {bound})
    os.sched_setaffinity(0, {bound})  # the client starts on the worker's CPU
    os.sched_setaffinity(0, affinity)
    for host in ("127.0.0.1", "localhost"):
        assert loopback_server_group(f"http://{host}:{port}/v1") == leader
    with pinned_to_one_cpu(loopback_server_group(f"http://127.0.0.1:{port}")) as pinning:
        assert os.sched_getaffinity(0) == {pinning.cpu}
    assert pinning.cpu is not None and pinning.cpu != bound
    assert pinning.server_cpus == (bound,)


def test_no_local_server_for_a_remote_url_or_a_port_nobody_listens_on(
        listener: tuple[int, int, int]) -> None:
    _, _, port = listener
    assert loopback_server_group(f"http://10.0.0.1:{port}") is None
    with socket.socket() as closed:  # a port bound, never listened on
        closed.bind(("127.0.0.1", 0))
        assert loopback_server_group(f"http://127.0.0.1:{closed.getsockname()[1]}") is None
    with socket.socket() as own:  # a server inside the client's process: nothing to keep off
        own.bind(("127.0.0.1", 0))
        own.listen()
        assert loopback_server_group(f"http://127.0.0.1:{own.getsockname()[1]}") is None
