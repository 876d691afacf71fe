"""An agentic-coding point on the process backend: the trace replay over HTTP against the
server its launch spec starts, with the argv InferenceX's agentic scripts give it (the model's
native context, the prefix cache on). The same on docker (test_docker_plugin.py) and slurm
(test_slurm_plugin.py). A server that stalls or crashes mid-replay fails its point in bounded
time, naming the request and the cause."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest
from lifecycle_helpers import (
    agentic_point,
    assert_replayed_on_an_agentic_server,
    load_node,
    sim_command,
    write_agentic_recipe,
)

from pytest_inferbench.backends.base import LoadSettings, PointNotMeasuredError
from pytest_inferbench.backends.process import ProcessBackend
from pytest_inferbench.sim.server.faults import FAULT_EXIT_CODE

if TYPE_CHECKING:
    from pathlib import Path

    from pytest_inferbench.backends.base import StartContext

# In a subprocess: a run's httpx must be the one its `except` clauses name, and pytester's
# in-process runs forget and re-import modules.
FAST = ("-p", "no:cacheprovider", "-rs", "--inferbench-replay-duration=0.5",
        "--inferbench-no-plots")


def test_an_agentic_point_replays_against_the_server_the_process_backend_starts(
        pytester: pytest.Pytester) -> None:
    write_agentic_recipe(pytester.path, sim_command(sys.executable))
    result = pytester.runpytest_subprocess(*FAST, "--inferbench-backend=process")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*traces:synthetic*passed*"])
    assert_replayed_on_an_agentic_server(
        agentic_point(pytester.path / "inferbench-results"), "process")


# A replay that would run two minutes if nothing stopped it.
LONG = ("-p", "no:cacheprovider", "--inferbench-replay-duration=120", "--inferbench-no-plots",
        "--inferbench-backend=process", "--inferbench-stall-timeout=2")
BOUND_S = 90.0  # the server's start and the stop included, on a busy machine


def test_a_stream_that_stalls_mid_replay_fails_the_point_naming_it(
        pytester: pytest.Pytester) -> None:
    """Every stream stops after 2 tokens, its connection open: the stall timeout (2 s) ends
    the first one and with it the replay; the point fails naming the request, its lane and
    the timeout, its result kept."""
    write_agentic_recipe(pytester.path, sim_command(sys.executable,
                                                    ("--stall-after-tokens", "2")))
    started = time.monotonic()
    result = pytester.runpytest_subprocess(*LONG)
    elapsed = time.monotonic() - started
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*the agentic replay stopped early: request synthetic-* turn * (play *) on lane *, "
        "sent * s in, stalled: no data for 2 s (--inferbench-stall-timeout); the replay "
        "stopped * s in, * other request(s) in flight cancelled*"])
    assert elapsed < BOUND_S, elapsed
    point = agentic_point(pytester.path / "inferbench-results")
    validity = point["agentic"]["validity"]  # type: ignore[index]
    assert any(r.startswith("run_cancelled: request synthetic-")
               for r in validity["invalid_reasons"])


def test_a_server_that_crashes_mid_replay_fails_the_point_with_its_log(
        pytester: pytest.Pytester) -> None:
    """The server exits once 3 requests have finished, cutting the others in flight: the
    replay stops at the first request that finds it gone, and the point fails naming that
    request and its lane, then the exit and the server's log tail."""
    write_agentic_recipe(pytester.path, sim_command(sys.executable,
                                                    ("--fail-after-requests", "3")))
    started = time.monotonic()
    result = pytester.runpytest_subprocess(*LONG)
    elapsed = time.monotonic() - started
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*request synthetic-* turn * (play *) on lane *, sent * s in, lost the server: "
        "connection *; the replay stopped * s in, * other request(s) in flight cancelled",
        f"*server * exited with code {FAULT_EXIT_CODE} during the sweep*",
        "*--- last log lines ---*",
        "*--fail-after-requests*"])
    assert elapsed < BOUND_S, elapsed


def test_a_server_stopped_mid_replay_fails_the_point_naming_the_stall_and_the_silence(
        tmp_path: Path, start_context: StartContext) -> None:
    """SIGSTOP on the server's process group half a second into a minute's replay: its
    sockets stay open and nothing answers. The stall timeout stops the replay, the server's
    health check stays silent, and the point fails with the stalled request and the log."""
    server, spec = load_node(write_agentic_recipe(tmp_path, sim_command(sys.executable)))
    handle = ProcessBackend().start(server, spec, start_context)
    pid = handle.local_server_pid
    assert pid is not None
    stopper = threading.Timer(0.5, os.killpg, (pid, signal.SIGSTOP))
    started = time.monotonic()
    try:
        stopper.start()
        with pytest.raises(PointNotMeasuredError) as caught:
            handle.run_point(server.points()[0], LoadSettings(
                replay_duration_s=60.0, stall_timeout_s=2.0, warmup_per_conc=0))
        elapsed = time.monotonic() - started
    finally:
        stopper.cancel()
        os.killpg(pid, signal.SIGCONT)
        handle.stop()
    first, *rest = str(caught.value).splitlines()
    assert first.startswith("request synthetic-") and " on lane " in first
    assert "stalled: no data for 2 s (--inferbench-stall-timeout)" in first
    assert "still runs but did not answer" in rest[0] and "--- last log lines ---" in rest
    assert elapsed < 45.0, elapsed  # not the minute of the replay
