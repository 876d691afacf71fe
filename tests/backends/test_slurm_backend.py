"""The slurm backend against a real Slurm: allocations, srun steps, job states, cleanup.

The cluster is the one-host Slurm of `/work/shared/scripts/start-slurm.sh`; the servers are the
simulator at time scale 0 with the ATOM argv of the test launch spec. Every test ends with no
job of its run in squeue (`no_jobs_left`).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import httpx
import pytest
from lifecycle_helpers import load_node, sim_command, with_settings, write_recipe

from pytest_inferbench.backends import get_backend
from pytest_inferbench.backends.base import LoadSettings, ServerDiedError, ServerStartError
from pytest_inferbench.backends.slurm.backend import SlurmBackend
from pytest_inferbench.loadgen.scrape import parse_metrics

if TYPE_CHECKING:
    from pathlib import Path

    from pytest_inferbench.backends.base import StartContext
    from pytest_inferbench.backends.supervised import SupervisedHandle

pytestmark = pytest.mark.usefixtures("no_jobs_left")

LOAD = LoadSettings(prompts_per_conc=2, warmup_per_conc=1)


def job_of(handle: SupervisedHandle) -> str:
    return str(handle.supervised.allocation.job_id)  # type: ignore[attr-defined]


def squeue_state(job_id: str) -> str:
    return subprocess.run(["squeue", "--noheader", f"--jobs={job_id}", "--format=%T"],
                          capture_output=True, text=True, timeout=30, check=False).stdout.strip()


def run_points_until_dead(handle: SupervisedHandle, point: object, timeout_s: float) -> str:
    """Run points until one fails with ServerDiedError; its message."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            handle.run_point(point, LOAD)  # type: ignore[arg-type]
        except ServerDiedError as exc:
            return str(exc)
        time.sleep(0.5)
    raise AssertionError(f"the server still served {timeout_s}s later")


def test_registry_knows_the_slurm_backend() -> None:
    assert get_backend("slurm").name == "slurm"


def test_a_node_is_served_from_its_allocation_and_cancelled_at_stop(
        tmp_path: Path, slurm_context: StartContext) -> None:
    server, spec = load_node(write_recipe(tmp_path, command=sim_command(sys.executable)))
    handle = SlurmBackend().start(server, spec, slurm_context)
    job = job_of(handle)
    try:
        assert squeue_state(job) == "RUNNING"
        host = handle.supervised.allocation.hosts[0]  # type: ignore[attr-defined]
        assert handle.base_url.startswith(f"http://{host}:")  # the node's hostname
        measurement = handle.run_point(server.points()[0], LOAD)
        assert measurement.simulated and all(r.success for r in measurement.records)
    finally:
        handle.stop()
        handle.stop()
    assert squeue_state(job) == ""
    log = next((tmp_path / "server-logs").glob("*.log")).read_text()
    assert "SIMULATED" in log and "listening on" in log


def test_a_server_killed_inside_its_job_fails_the_point_with_the_step_and_log_tail(
        tmp_path: Path, slurm_context: StartContext) -> None:
    recipe = write_recipe(tmp_path, command=sim_command(
        sys.executable, ("--fail-after-requests", "2")))
    server, spec = load_node(recipe)
    handle = SlurmBackend().start(server, spec, slurm_context)
    try:
        message = run_points_until_dead(handle, server.points()[0], 60)
    finally:
        handle.stop()
    head, _, tail = message.partition("--- last log lines ---")
    assert "srun step exited with code" in head, message
    assert f"slurm job {job_of(handle)} RUNNING: the server process ended inside the job" in head
    assert "srun: error:" in tail, message  # srun's own report of the task's end


def test_a_job_past_its_time_limit_fails_the_point_with_slurms_reason(
        tmp_path: Path, slurm_context: StartContext) -> None:
    server, spec = load_node(write_recipe(tmp_path, command=sim_command(sys.executable)))
    handle = SlurmBackend().start(server, spec, slurm_context)
    try:
        # Slurm counts limits in whole minutes and checks them every 30 s; a limit of 0 set
        # on the running job expires at the next check instead of a minute from now.
        subprocess.run(["scontrol", "update", f"JobId={job_of(handle)}", "TimeLimit=0"],
                       timeout=30, check=True)
        message = run_points_until_dead(handle, server.points()[0], 90)
    finally:
        handle.stop()
    assert f"slurm job {job_of(handle)} TIMEOUT, reason TimeLimit" in message, message
    assert "DUE TO TIME LIMIT" in message.partition("--- last log lines ---")[2], message


def test_a_cancelled_job_fails_the_point_at_once(
        tmp_path: Path, slurm_context: StartContext) -> None:
    server, spec = load_node(write_recipe(tmp_path, command=sim_command(sys.executable)))
    handle = SlurmBackend().start(server, spec, slurm_context)
    try:
        subprocess.run(["scancel", job_of(handle)], timeout=30, check=True)
        started = time.monotonic()
        message = run_points_until_dead(handle, server.points()[0], 30)
        took = time.monotonic() - started
    finally:
        handle.stop()
    assert f"slurm job {job_of(handle)} CANCELLED" in message, message
    assert "CANCELLED AT" in message.partition("--- last log lines ---")[2], message
    assert took < 20, f"the cancelled job took {took:.1f}s to notice"


def test_a_never_ready_server_fails_its_start_and_its_job_is_cancelled(
        tmp_path: Path, slurm_context: StartContext, run_id: str) -> None:
    recipe = write_recipe(tmp_path, timeout=3, command=sim_command(
        sys.executable, ("--never-ready",)))
    server, spec = load_node(recipe)
    with pytest.raises(ServerStartError) as failure:
        SlurmBackend().start(server, spec, slurm_context)
    head, _, tail = str(failure.value).partition("--- last log lines ---")
    assert "not ready after 3s" in head and "/health: HTTP 503" in head, failure.value
    assert "SIMULATED" in tail


def test_a_server_that_exits_at_start_names_the_step_and_the_job(
        tmp_path: Path, slurm_context: StartContext) -> None:
    recipe = write_recipe(tmp_path, command=sim_command(sys.executable, ("--error-rate", "7")))
    server, spec = load_node(recipe)
    with pytest.raises(ServerStartError) as failure:
        SlurmBackend().start(server, spec, slurm_context)
    message = str(failure.value)
    assert "exited with code 2 (srun step exited with code 2; slurm job" in message, message
    assert "--error-rate 7.0" in message.partition("--- last log lines ---")[2], message


def test_an_allocation_slurm_refuses_fails_with_sallocs_words(
        tmp_path: Path, slurm_context: StartContext) -> None:
    server, spec = load_node(write_recipe(tmp_path, command=sim_command(sys.executable)))
    settings = dataclasses.replace(slurm_context.options.slurm, args=("--mem=100T",))
    with pytest.raises(ServerStartError, match=r"salloc exited with code 1: .*"
                       r"(Requested node configuration is not available|Memory specification)"):
        SlurmBackend().start(server, spec, with_settings(slurm_context, slurm=settings))


def test_an_allocation_that_can_never_start_fails_with_slurms_reason(
        tmp_path: Path, slurm_context: StartContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three nodes from a one-node partition: Slurm queues the job (PartitionConfig) and
    salloc would wait for ever; the start fails naming the reason, and the job is gone."""
    from pytest_inferbench.backends.slurm import jobs

    monkeypatch.setattr(jobs, "UNSATISFIABLE_GRACE_S", 2.0)
    recipe = write_recipe(tmp_path)
    (tmp_path / "launch" / "minimaxm3_fp4_mi355x_atom.yaml").write_text(
        ROLES.format(python=sys.executable).replace("nodes: 1", "nodes: 3"))
    server, spec = load_node(recipe)
    # Without the watch salloc would wait for ever; --immediate makes it give up (with other
    # words than the assertion's) instead of hanging the suite.
    settings = slurm_context.options.slurm
    settings = dataclasses.replace(settings, args=(*settings.args, "--immediate=120"))
    with pytest.raises(ServerStartError) as failure:
        SlurmBackend().start(server, spec, with_settings(slurm_context, slurm=settings))
    message = str(failure.value)
    assert re.search(r"slurm job (\d+) PENDING, reason PartitionConfig: Slurm will not start",
                     message), message
    assert "--nodes=3" in message
    job = re.search(r"slurm job (\d+)", message).group(1)  # type: ignore[union-attr]
    assert squeue_state(job) == ""


@pytest.mark.parametrize(("words", "reason"), [
    (("--hold",), "JobHeldUser"), (("--begin=now+1hour",), "BeginTime")])
def test_an_allocation_still_queued_after_the_startup_timeout_is_cancelled(
        tmp_path: Path, slurm_context: StartContext, words: tuple[str, ...], reason: str
        ) -> None:
    server, spec = load_node(write_recipe(tmp_path, timeout=3,
                                          command=sim_command(sys.executable)))
    # --immediate: salloc itself gives up (with other words) should the bound not hold.
    settings = slurm_context.options.slurm
    settings = dataclasses.replace(settings, args=(*settings.args, *words, "--immediate=60"))
    with pytest.raises(ServerStartError) as failure:
        SlurmBackend().start(server, spec, with_settings(slurm_context, slurm=settings))
    message = str(failure.value)
    found = re.search(rf"slurm job (\d+) still PENDING \(reason {reason}\) after 3 s startup "
                      r"timeout; it was cancelled", message)
    assert found, message
    assert squeue_state(found.group(1)) == ""


def test_a_job_whose_name_a_salloc_word_replaced_is_not_kept(
        tmp_path: Path, slurm_context: StartContext) -> None:
    """`-vJ other` is `--verbose --job-name=other` to salloc, a spelling the option check
    lets through: the job, which no later run's sweep would recognize, is cancelled."""
    server, spec = load_node(write_recipe(tmp_path, command=sim_command(sys.executable)))
    settings = slurm_context.options.slurm
    settings = dataclasses.replace(settings, args=(*settings.args, "-vJother"))
    with pytest.raises(ServerStartError) as failure:
        SlurmBackend().start(server, spec, with_settings(slurm_context, slurm=settings))
    message = str(failure.value)
    found = re.search(r"slurm job (\d+) is named 'other' with comment 'inferbench owner=.*: a "
                      r"word of --inferbench-slurm-args replaced them", message)
    assert found, message
    assert squeue_state(found.group(1)) == ""


ROLES = """\
command: [{python}, -m, pytest_inferbench.sim, serve, --hardware, MI355X, --time-scale, "0",
          --, python3, -m, atom.entrypoints.openai_server, --model, "{{model}}", -tp, "{{tp}}"]
nodes: 1
roles:
  worker:
    count: 2
    args: [--server-port, "{{port}}"]
    env: {{ INFERBENCH_ROLE: worker }}
  router:
    command: [{python}, -m, pytest_inferbench.sim, route, --port, "{{port}}",
              --workers, "{{addrs:worker}}"]
serve-role: router
startup-timeout: 60
"""


def test_a_router_and_two_workers_come_up_as_steps_and_serve_points(
        tmp_path: Path, slurm_context: StartContext) -> None:
    recipe = write_recipe(tmp_path)
    (tmp_path / "launch" / "minimaxm3_fp4_mi355x_atom.yaml").write_text(
        ROLES.format(python=sys.executable))
    server, spec = load_node(recipe)
    handle = SlurmBackend().start(server, spec, slurm_context)
    try:
        steps = handle.supervised.steps  # type: ignore[attr-defined]
        assert [s.label for s in steps] == ["worker.0", "worker.1", "router.0"]
        measurement = handle.run_point(server.points()[1], LOAD)  # conc 2: both workers
        assert measurement.simulated and all(r.success for r in measurement.records)
        # Both workers served requests (the router takes turns), and the router's /metrics
        # adds their counters up: the point's finished-request delta covers all of them.
        log = handle.log_tail(200)
        ports = [line.rsplit(":", 1)[1] for line in log.splitlines()
                 if line.startswith("[worker.") and "listening on" in line]
        finished = [parse_metrics(httpx.get(f"http://127.0.0.1:{port}/metrics",
                                            trust_env=False).text)[0]
                    ["atom:requests_finished_total"] for port in ports]
        assert len(finished) == 2 and min(finished) > 0, finished
        total = len(measurement.records) + LOAD.warmup_per_conc * 2
        assert sum(finished) == total
        deltas = measurement.server_metrics["counter_deltas"]
        assert deltas["atom:requests_finished_total"] == len(measurement.records)
    finally:
        handle.stop()
    assert squeue_state(job_of(handle)) == ""


def test_container_mode_imports_the_image_once_and_hands_srun_the_pyxis_options(
        tmp_path: Path, slurm_context: StartContext, fake_enroot: Path) -> None:
    """This Slurm has no pyxis: srun refusing `--container-image` shows the words reached it;
    the node's error carries srun's answer and the allocation is cancelled."""
    server, spec = load_node(write_recipe(tmp_path, command=sim_command(sys.executable)))
    settings = dataclasses.replace(slurm_context.options.slurm, container=True,
                                   squash_dir=tmp_path / "squash")
    ctx = with_settings(slurm_context, slurm=settings)
    for _ in range(2):
        with pytest.raises(ServerStartError) as failure:
            SlurmBackend().start(server, spec, ctx)
        tail = str(failure.value).partition("--- last log lines ---")[2]
        assert re.search(r"srun: (unrecognized|unknown) option.*--container-image="
                         + re.escape(str(tmp_path / "squash")), tail), failure.value
    assert len(fake_enroot.read_text().splitlines()) == 1  # imported once for both starts
