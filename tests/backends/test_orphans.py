"""A SIGKILLed pytest runs no teardown: its local servers live on. The next run finds them by
the owner mark in their environment and kills them, children included."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lifecycle_helpers import write_recipe

from pytest_inferbench.backends import reaper
from pytest_inferbench.backends.reaper import OWNER_ENV

# A prefix in the role of `srun ...`: the server runs as its child, so the server group holds
# two processes that both carry the mark. Its output goes nowhere, so neither dies of a broken
# pipe when pytest is gone (a server that logs to a file would not either).
WRAPPER = ("import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:], "
           "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))")


# A pytest run of the recipe with the process backend (each test adds its selection).
PROCESS_RUN = (sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--inferbench-backend",
               "process")
# The same run as a terminal's foreground job: SIGINT raises KeyboardInterrupt. A suite started
# in the background by a non-interactive shell (`pytest tests &`, nohup) hands its children
# SIGINT ignored, and Python keeps an inherited SIG_IGN, so the run would sleep through the
# Ctrl-C; the run restores the terminal's disposition before pytest starts.
FOREGROUND_RUN = (sys.executable, "-c", "import signal, sys, pytest; "
                  "signal.signal(signal.SIGINT, signal.default_int_handler); "
                  "sys.exit(pytest.console_main())", *PROCESS_RUN[3:])


def marked_processes(owner: str) -> list[int]:
    """Pids of the processes whose environment carries `INFERBENCH_OWNER=owner`."""
    mark = f"{OWNER_ENV}={owner}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def catches(pid: int, sig: signal.Signals) -> bool:
    """Does process `pid` have a handler for `sig` (/proc/<pid>/status SigCgt)?"""
    status = (Path("/proc") / str(pid) / "status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines()
                      if line.startswith("SigCgt:")), 16)
    return bool(caught >> (sig - 1) & 1)


def wait_for(predicate: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def start_and_sigkill(path: Path, env: dict[str, str]) -> tuple[str, list[int]]:
    """Start a run whose server stays loading, SIGKILL it once the server group is up; its
    owner mark and the marked processes alive a second later."""
    first = subprocess.Popen(
        [*PROCESS_RUN, "--inferbench-process-prefix", f"{sys.executable} wrapper.py",
         "-k", "conc1"],
        cwd=path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    owner = f"{socket.gethostname()}:{first.pid}"
    try:
        assert wait_for(lambda: len(marked_processes(owner)) >= 2, 60), "server never started"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    time.sleep(1.0)
    return owner, marked_processes(owner)


def next_run_sweep(path: Path, env: dict[str, str]) -> set[int]:
    """A run that starts no server; the pids it says it killed as stale."""
    second = subprocess.run(
        [*PROCESS_RUN, "-k", "no-such-point"],
        cwd=path, env=env, capture_output=True, text=True, timeout=120)
    return {int(line.split("process ")[1].split()[0]) for line in second.stdout.splitlines()
            if "killed stale server process" in line}


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc (Linux)")
def test_servers_of_a_sigkilled_run_are_killed_by_the_next_run(
        pytester: pytest.Pytester) -> None:
    # A server that stays "loading" (503) for a minute: the run is waiting for it when killed.
    write_recipe(pytester.path, python=sys.executable, timeout=120,
                 sim_options={"fp4": ("--startup-delay", "60")})
    (pytester.path / "wrapper.py").write_text(WRAPPER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # Every run on this host sweeps the servers of dead owners, so under xdist another test's
    # run can sweep these first: the orphans are gone, but not by this test's second run.
    # Then the scenario runs again; servers that die with their pytest, or a sweep that
    # misses them, fail every attempt. Orphans still alive after the second run fail at once.
    orphans: list[int] = []
    killed: set[int] = set()
    for _ in range(3):
        owner, orphans = start_and_sigkill(pytester.path, env)
        try:
            if len(orphans) < 2:
                continue
            killed = next_run_sweep(pytester.path, env)
            assert wait_for(lambda owner=owner: not marked_processes(owner), 10), (
                marked_processes(owner))
        finally:
            for pid in marked_processes(owner):
                os.kill(pid, signal.SIGKILL)
        if killed >= set(orphans):
            break
    assert len(orphans) >= 2  # wrapper and server outlived their pytest
    assert killed >= set(orphans)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc (Linux)")
def test_a_ctrl_c_reaches_pytest_only_and_its_teardown_stops_the_server(
        pytester: pytest.Pytester) -> None:
    # The server shares pytest's session (no CPU group of its own under sched autogroups) but
    # not its process group: a terminal's Ctrl-C, sent to the foreground group, reaches pytest
    # alone, and pytest's teardown stops the server.
    write_recipe(pytester.path, python=sys.executable, timeout=120,
                 sim_options={"fp4": ("--startup-delay", "60")})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # The run's own group plays the terminal's foreground group.
    run = subprocess.Popen([*FOREGROUND_RUN, "-k", "conc1"], cwd=pytester.path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, process_group=0)
    owner = f"{socket.gethostname()}:{run.pid}"
    try:
        assert wait_for(lambda: marked_processes(owner), 60), "server never started"
        server = marked_processes(owner)[0]
        assert os.getsid(server) == os.getsid(run.pid)
        assert os.getpgid(server) == server != os.getpgid(run.pid)
        assert catches(run.pid, signal.SIGINT), "the run would ignore the Ctrl-C"
        os.killpg(run.pid, signal.SIGINT)
        output = run.communicate(timeout=60)[0].decode()
        assert "KeyboardInterrupt" in output
        assert wait_for(lambda: not marked_processes(owner), 15), marked_processes(owner)
    finally:
        run.kill()
        for pid in marked_processes(owner):
            os.kill(pid, signal.SIGKILL)


def test_a_ctrl_c_while_a_server_starts_is_raised_once_the_server_is_tracked() -> None:
    # Popen waits for the child's exec: a KeyboardInterrupt raised inside it would leave the
    # server running with no one holding it. Held, it is raised when the block ends.
    reached = []
    with pytest.raises(KeyboardInterrupt), reaper.sigint_held():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the signal is delivered here, between bytecodes
        reached.append("after the signal")
    assert reached == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
