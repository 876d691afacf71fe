"""The process, sim-server and external backends against the real simulated HTTP server."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from lifecycle_helpers import (
    assert_never_ready_message,
    load_node,
    sim_command,
    with_settings,
    write_recipe,
)

from pytest_inferbench import options
from pytest_inferbench.backends import BACKENDS, get_backend
from pytest_inferbench.backends.base import LoadSettings, PointNotMeasuredError, ServerStartError
from pytest_inferbench.backends.external import ExternalBackend
from pytest_inferbench.backends.process import ProcessBackend
from pytest_inferbench.backends.simserver import SimServerBackend

if TYPE_CHECKING:
    from pytest_inferbench.backends.base import StartContext
    from pytest_inferbench.backends.supervised import SupervisedHandle

LOAD = LoadSettings(prompts_per_conc=2, warmup_per_conc=1)

# A prefix in the role of `srun ...`: runs the server as its child and ignores SIGTERM itself,
# so only a kill of the whole process group ends both.
WRAPPER = (sys.executable, "-c",
           "import signal, subprocess, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "sys.exit(subprocess.call(sys.argv[1:]))")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_group_gone(pgid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def server_pid(handle: SupervisedHandle) -> int:
    return int(handle.supervised.process.pid)  # type: ignore[attr-defined]


def test_registry_covers_every_backend_name() -> None:
    names = ("sim", "sim-server", "docker", "process", "external", "slurm")
    assert tuple(BACKENDS) == names == options.BACKENDS  # the option's choices
    assert [get_backend(n).name for n in names] == list(names)
    assert [n for n, info in BACKENDS.items() if info.simulated] == ["sim", "sim-server"]
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        get_backend("nope")


def test_sim_server_runs_points_and_says_they_are_simulated(
        tmp_path: Path, start_context: StartContext) -> None:
    server, spec = load_node(write_recipe(tmp_path))
    handle = SimServerBackend().start(server, spec, start_context)
    pgid = server_pid(handle)
    try:
        # Its own group, for the group kill; this run's session, so that under sched
        # autogroups it gets no CPU group of its own to starve the load client with.
        assert os.getpgid(pgid) == pgid
        assert os.getsid(pgid) == os.getsid(0)
        measurement = handle.run_point(server.points()[0], LOAD)
        assert measurement.simulated
        assert all(r.success for r in measurement.records)
        # The server announced its clock: at time scale 0 the timings are not meaningful.
        assert measurement.time_scale == start_context.options.time_scale == 0.0
        assert measurement.client_check["not_applicable"]
    finally:
        handle.stop()
    assert wait_group_gone(pgid)
    assert "SIMULATED" in next((tmp_path / "server-logs").glob("*.log")).read_text()


def test_process_backend_runs_the_argv_behind_a_prefix_and_kills_the_group(
        tmp_path: Path, start_context: StartContext) -> None:
    recipe = write_recipe(tmp_path, command=sim_command(python=sys.executable))
    server, spec = load_node(recipe)
    ctx = with_settings(start_context, process_prefix=WRAPPER)
    handle = ProcessBackend().start(server, spec, ctx)
    pgid = server_pid(handle)
    try:
        assert os.getpgid(pgid) == pgid
        assert os.getsid(pgid) == os.getsid(0)
        measurement = handle.run_point(server.points()[0], LOAD)
        assert all(r.success for r in measurement.records)
        handle.check_alive()
    finally:
        handle.stop()
        handle.stop()
    assert wait_group_gone(pgid), "the wrapper or the server outlived the teardown"


def test_a_server_that_runs_but_never_answers_fails_the_point_with_its_log(
        tmp_path: Path, start_context: StartContext) -> None:
    """A stopped (hung) server: its requests stall, it does not exit, its health check never
    answers. The point fails in bounded time with the server's log tail, not as a page of
    timed-out requests; the server is still the node's (SIGCONT and it serves again)."""
    recipe = write_recipe(tmp_path, command=sim_command(python=sys.executable))
    server, spec = load_node(recipe)
    handle = ProcessBackend().start(server, spec, start_context)
    pid = server_pid(handle)
    try:
        os.kill(pid, signal.SIGSTOP)
        load = LoadSettings(prompts_per_conc=1, warmup_per_conc=0, stall_timeout_s=1.0)
        with pytest.raises(PointNotMeasuredError) as stalled:
            handle.run_point(server.points()[0], load)
        message = str(stalled.value)
        assert "still runs but did not answer" in message and "/health" in message
        assert "--- last log lines ---" in message and "SIMULATED" in message
        os.kill(pid, signal.SIGCONT)
        handle.check_alive()
    finally:
        os.kill(pid, signal.SIGCONT)
        handle.stop()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs CPU affinity and at least 2 CPUs")
def test_the_client_pins_itself_off_the_cpu_a_local_server_is_bound_to(
        tmp_path: Path, start_context: StartContext) -> None:
    bound = min(os.sched_getaffinity(0))
    # A prefix in the role of `taskset -c N`: the server runs bound to one CPU.
    taskset = (sys.executable, "-c", f"import os, sys; os.sched_setaffinity(0, {{{bound}}}); "
               "os.execv(sys.argv[1], sys.argv[1:])")
    recipe = write_recipe(tmp_path, command=sim_command(python=sys.executable))
    server, spec = load_node(recipe)
    handle = ProcessBackend().start(server, spec, with_settings(start_context,
                                                                process_prefix=taskset))
    try:
        assert os.sched_getaffinity(server_pid(handle)) == {bound}
        check = handle.run_point(server.points()[0], LOAD).client_check
    finally:
        handle.stop()
    assert check["client_cpu_pinned"] not in (None, bound)
    assert f"off the local server's bound CPUs [{bound}]" in str(check["client_cpu_choice"])


def test_process_backend_never_ready_stops_the_server_it_started(
        tmp_path: Path, start_context: StartContext) -> None:
    seed = str(time.time_ns() % 1_000_000_007)  # marks this test's server in the process table
    recipe = write_recipe(tmp_path, timeout=2, command=sim_command(
        python=sys.executable, sim_options=("--never-ready", "--seed", seed)))
    server, spec = load_node(recipe)
    with pytest.raises(ServerStartError) as failure:
        ProcessBackend().start(server, spec, start_context)
    assert_never_ready_message(str(failure.value), 2)
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit()
                and f"\0--seed\0{seed}\0".encode() in _cmdline(pid)]


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read()
    except OSError:
        return b""


def test_process_backend_passes_a_shell_like_model_as_one_argument(
        tmp_path: Path, start_context: StartContext) -> None:
    marker = tmp_path / "pwned"
    model = f"x; touch {marker}"
    recipe = write_recipe(tmp_path, model=model, command=sim_command(python=sys.executable))
    server, spec = load_node(recipe)
    with pytest.raises(ServerStartError, match=re.escape(f"unknown model {model!r}")):
        ProcessBackend().start(server, spec, start_context)
    assert not marker.exists()


def test_external_backend_uses_a_running_server_and_never_stops_it(
        tmp_path: Path, start_context: StartContext) -> None:
    server, spec = load_node(write_recipe(tmp_path))
    owner = SimServerBackend().start(server, spec, start_context)
    try:
        ctx = with_settings(start_context, base_url=owner.base_url + "/")
        external = ExternalBackend().start(server, spec, ctx)
        measurement = external.run_point(server.points()[0], LOAD)
        assert all(r.success for r in measurement.records)
        assert measurement.simulated
        external.stop()
        assert httpx.get(f"{owner.base_url}/health", trust_env=False).status_code == 200
    finally:
        owner.stop()


def test_external_backend_reports_a_dead_url_clearly(
        tmp_path: Path, start_context: StartContext) -> None:
    server, spec = load_node(write_recipe(tmp_path))
    ctx = with_settings(start_context, base_url="http://127.0.0.1:9")
    with pytest.raises(ServerStartError, match=r"does not answer at http://127.0.0.1:9/health"):
        ExternalBackend().start(server, spec, ctx)
    with pytest.raises(ServerStartError, match="needs --inferbench-base-url"):
        ExternalBackend().start(server, spec, with_settings(start_context, base_url=None))


ABANDON = """
import sys, types
from pathlib import Path
sys.path.insert(0, {helpers!r})
from lifecycle_helpers import load_node, write_recipe
from pytest_inferbench.backends.base import StartContext
from pytest_inferbench.backends.simserver import SimServerBackend
root = Path({root!r})
server, spec = load_node(write_recipe(root))
options = types.SimpleNamespace(time_scale=0.0, pass_env=(), startup_timeout_s=None,
                                base_url=None, sim_calibration=None)
handle = SimServerBackend().start(server, spec, StartContext(root, "abandon", "master", options))
print(handle.supervised.process.pid, flush=True)
sys.exit(0)  # no stop(): the atexit safety net must end the server
"""


def test_a_handle_never_stopped_is_stopped_at_interpreter_exit(tmp_path: Path) -> None:
    import subprocess

    script = ABANDON.format(helpers=str(Path(__file__).parent), root=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    pgid = int(done.stdout.split()[0])
    assert wait_group_gone(pgid)
