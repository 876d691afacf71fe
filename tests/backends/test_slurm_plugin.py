"""Whole pytest runs with `--inferbench-backend slurm` against the real one-host Slurm.

Each run is a pytest subprocess; while it runs, squeue is polled for the jobs its processes
own (the job comment names the owning pid, an xdist worker's parent is the run), so every test
knows the jobs of its run and checks that none is left in squeue afterwards.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest
from lifecycle_helpers import (
    agentic_point,
    assert_replayed_on_an_agentic_server,
    cancel_jobs,
    slurm_jobs,
    write_agentic_recipe,
    write_recipe,
)

from pytest_inferbench.results.point_files import AGG_PREFIX, point_record

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("slurm")

FAST = ("-p", "no:cacheprovider", "--inferbench-backend", "slurm",
        "--inferbench-prompts-per-conc", "2", "--inferbench-slurm-gres", "none",
        "--inferbench-slurm-args", "--mem=256M --oversubscribe", "--inferbench-slurm-time", "10",
        "--inferbench-results=results")


def parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            return int(re.search(r"PPid:\s+(\d+)", status.read()).group(1))  # type: ignore[union-attr]
    except OSError:
        return None


@dataclass
class Run:
    """A pytest subprocess and the Slurm jobs its processes owned while it ran."""

    process: subprocess.Popen[bytes]
    jobs: dict[str, str] = field(default_factory=dict)  # id -> name
    output: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)

    def watch(self) -> None:
        family = {self.process.pid}
        while not self._stop.is_set():
            for job_id, name, _, comment in slurm_jobs():
                owner = re.search(r"owner=[^ ]*:(\d+)", comment)
                if owner and (int(owner.group(1)) in family
                              or parent_pid(int(owner.group(1))) in family):
                    self.jobs[job_id] = name
            time.sleep(0.2)

    def wait(self, timeout_s: float = 240) -> int:
        try:
            self.output = self.process.communicate(timeout=timeout_s)[0].decode()
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            self._stop.set()
        return self.process.returncode

    def left_in_squeue(self) -> list[str]:
        current = {job_id for job_id, *_ in slurm_jobs()}
        left = sorted(set(self.jobs) & current)
        cancel_jobs(left) if left else None
        return left


# pytest as a terminal starts it, with Python's own Ctrl-C handler: a suite launched from a
# background job of a shell without job control inherits SIGINT ignored, and so would the run.
PYTEST_WITH_CTRL_C = ("import runpy, signal; "
                      "signal.signal(signal.SIGINT, signal.default_int_handler); "
                      "runpy.run_module('pytest', run_name='__main__', alter_sys=True)")


def start_run(cwd: Path, *args: str) -> Run:
    process = subprocess.Popen([sys.executable, "-c", PYTEST_WITH_CTRL_C, *FAST, *args], cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)  # its own process group, as a CI job's
    run = Run(process)
    threading.Thread(target=run.watch, daemon=True).start()
    return run


def wait_for_servers(tmp_path: Path, run: Run, count: int, timeout_s: float = 90) -> None:
    log_dir = tmp_path / "results" / "server-logs"
    deadline = time.monotonic() + timeout_s
    while sum("listening on" in p.read_text() for p in log_dir.glob("*.log")) < count:
        assert run.process.poll() is None, run.process.communicate()[0].decode()
        assert time.monotonic() < deadline, "the servers never started"
        time.sleep(0.2)


def point_files(tmp_path: Path) -> dict[str, dict[str, object]]:
    """The raw point files, their `inferbench` namespace flattened (agg files left out)."""
    return {p.name: point_record(json.loads(p.read_text()))
            for p in (tmp_path / "results" / "points").glob("*.json")
            if not p.name.startswith(AGG_PREFIX)}


ATOM_ONLY = ('command: [python3, -m, atom.entrypoints.openai_server]\n'
             'args: [--model, "{model}", --server-port, "{port}", -tp, "{tp}"]\n')


def test_a_sweep_of_the_simulated_server_through_slurm_gives_every_backends_results(
        tmp_path: Path) -> None:
    """The launch spec names the real ATOM server; `--inferbench-slurm-sim` runs the simulator
    with that argv in its srun step, as the sim-server backend runs it locally."""
    runs = {}
    for backend in ("slurm", "sim-server"):
        directory = tmp_path / backend
        directory.mkdir()
        write_recipe(directory)
        (directory / "launch" / "minimaxm3_fp4_mi355x_atom.yaml").write_text(ATOM_ONLY)
        runs[backend] = start_run(directory, "--inferbench-backend", backend,
                                  "--inferbench-slurm-sim", "--inferbench-time-scale", "0")
    for run in runs.values():
        assert run.wait() == 0, run.output
        assert "2 passed" in run.output, run.output
    assert len(runs["slurm"].jobs) == 1 and not runs["slurm"].left_in_squeue()
    assert not runs["sim-server"].jobs
    (log,) = (tmp_path / "slurm" / "results" / "server-logs").glob("*.log")
    assert "SIMULATED atom server" in log.read_text()
    by_slurm, locally = point_files(tmp_path / "slurm"), point_files(tmp_path / "sim-server")
    assert set(by_slurm) == set(locally) and len(by_slurm) == 2
    for name, record in by_slurm.items():
        assert set(record) == set(locally[name])  # the same result form, key for key
        assert record["backend"] == "slurm" and record["simulated"] is True
        assert record["completed"] == record["num_prompts"]


def test_a_server_dying_mid_sweep_fails_its_point_and_errors_the_rest_at_once(
        tmp_path: Path) -> None:
    # The fp8 server exits after 3 requests (inside its first point); fp4 runs normally after.
    write_recipe(tmp_path, precisions=("fp8", "fp4"), sim_options={
        "fp8": ("--fail-after-requests", "3", "--time-scale", "1")})
    started = time.monotonic()
    run = start_run(tmp_path, "-rA")
    assert run.wait() == 1, run.output
    took = time.monotonic() - started
    assert re.search(r"1 failed, 2 passed, 1 error", run.output), run.output
    assert "srun step exited with code" in run.output
    assert "RUNNING: the server process ended inside the job" in run.output
    assert "--- last log lines ---" in run.output and "srun: error:" in run.output
    assert "server died during an earlier point of this node" in run.output
    assert len(run.jobs) == 2 and not run.left_in_squeue()
    assert took < 120, f"{took:.0f}s"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_an_interrupted_run_leaves_no_job_in_squeue(tmp_path: Path, sig: signal.Signals) -> None:
    # Real time and long outputs: the first point runs for minutes unless interrupted.
    write_recipe(tmp_path, osl=4000, sim_options={"fp4": ("--time-scale", "1")})
    run = start_run(tmp_path)
    wait_for_servers(tmp_path, run, 1)
    time.sleep(1.0)  # into the point's requests
    assert len(run.jobs) == 1, run.jobs
    os.killpg(run.process.pid, sig)  # a CI cancel signals the whole job
    assert run.wait(60) == 2, run.output  # pytest's "interrupted"
    assert "KeyboardInterrupt" in run.output
    assert not run.left_in_squeue()


def test_a_killed_runs_allocation_is_cancelled_by_the_next_run(tmp_path: Path) -> None:
    """The user's own `--comment` joins the owner tag that the sweep reads (salloc keeps one
    comment: the last given)."""
    write_recipe(tmp_path, osl=4000, sim_options={"fp4": ("--time-scale", "1")})
    crashed = start_run(tmp_path, "--inferbench-slurm-args",
                        "--mem=256M --oversubscribe --comment='nightly perf'")
    wait_for_servers(tmp_path, crashed, 1)
    os.killpg(crashed.process.pid, signal.SIGKILL)  # no teardown, no atexit
    crashed.wait(30)
    (job_id,) = crashed.jobs
    comments = {j: comment for j, _, _, comment in slurm_jobs()}
    assert comments[job_id].endswith("; nightly perf")  # left behind, as after a crash
    write_recipe(tmp_path, osl=4)
    later = start_run(tmp_path)
    assert later.wait() == 0, later.output
    assert f"inferbench: cancelled stale slurm job {job_id}" in later.output
    assert not crashed.left_in_squeue() and not later.left_in_squeue()


def test_two_xdist_workers_each_serve_their_node_from_their_own_allocation(
        tmp_path: Path) -> None:
    write_recipe(tmp_path, tps=(1, 2))
    run = start_run(tmp_path, "-n", "2", "--dist", "loadscope", "-v")
    assert run.wait() == 0, run.output
    assert "4 passed" in run.output
    workers = dict(re.findall(r"\[(gw\d+)\] .*?PASSED \S+::(\S+)::", run.output))
    assert sorted(workers) == ["gw0", "gw1"] and len(set(workers.values())) == 2, workers
    names = sorted(run.jobs.values())
    assert len(names) == 2 and {"-gw0-" in n for n in names} == {True, False}, names
    assert not run.left_in_squeue()


def test_an_agentic_point_replays_against_the_server_in_its_slurm_step(tmp_path: Path) -> None:
    """The trace replay reaches the server of the node's allocation, started with the
    agentic argv (native context, prefix cache on)."""
    write_agentic_recipe(tmp_path)
    run = start_run(tmp_path, "--inferbench-slurm-sim", "--inferbench-time-scale", "0",
                    "--inferbench-replay-duration", "0.5", "--inferbench-no-plots")
    assert run.wait() == 0, run.output
    assert "1 passed" in run.output, run.output
    assert len(run.jobs) == 1 and not run.left_in_squeue()
    assert_replayed_on_an_agentic_server(agentic_point(tmp_path / "results"), "slurm")
