"""Whole runs of the plugin with `--inferbench-backend docker` against a real engine.

Each run is a real pytest subprocess over a recipe whose launch spec points at the local
simulator image. After every run `docker ps -a --filter label=inferbench.run` must be empty.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

import pytest
from lifecycle_helpers import (
    agentic_point,
    assert_replayed_on_an_agentic_server,
    sim_command,
    write_agentic_recipe,
    write_recipe,
)

from pytest_inferbench.backends.reaper import LABEL_NODE, LABEL_OWNER, LABEL_RUN, LABEL_WORKER

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("sim_mounts")]

SECRET = "hf_" + uuid.uuid4().hex  # a fresh value, so a hit can only come from this test
FAST = ("-p", "no:cacheprovider", "--inferbench-backend", "docker",
        "--inferbench-prompts-per-conc", "2")


def all_inferbench_containers(client: Any) -> list[Any]:
    return list(client.containers.list(all=True, filters={"label": LABEL_RUN}))


@pytest.fixture
def no_containers_after(docker_client: Any) -> Iterator[None]:
    """`docker ps -a --filter label=inferbench.run` is empty after the run."""
    yield
    left = all_inferbench_containers(docker_client)
    for container in left:
        container.remove(force=True)
    assert not left, f"containers left behind: {[c.name for c in left]}"


@pytest.mark.usefixtures("no_containers_after")
def test_recipe_points_run_through_docker_and_no_artifact_holds_the_secret(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    write_recipe(pytester.path, leak_token=True)
    result = pytester.runpytest_subprocess(*FAST, "--junitxml=junit.xml",
                                           "--inferbench-results=results")
    result.assert_outcomes(passed=2)
    artifacts = [p for p in pytester.path.rglob("*") if p.is_file()]
    kinds = {p.suffix for p in artifacts}
    assert {".json", ".log", ".xml"} <= kinds, kinds
    for path in artifacts:
        assert SECRET not in path.read_text(errors="replace"), path
    assert SECRET not in result.stdout.str() + result.stderr.str()
    (log,) = (pytester.path / "results" / "server-logs").glob("*.log")
    assert "token ***HF_TOKEN***" in log.read_text()  # it reached the server, masked in the log


@pytest.mark.usefixtures("no_containers_after")
def test_an_agentic_point_replays_against_its_container(pytester: pytest.Pytester) -> None:
    write_agentic_recipe(pytester.path, sim_command())
    result = pytester.runpytest_subprocess(*FAST, "--inferbench-replay-duration=0.5",
                                           "--inferbench-no-plots")
    result.assert_outcomes(passed=1)
    assert_replayed_on_an_agentic_server(
        agentic_point(pytester.path / "inferbench-results"), "docker")


@pytest.mark.usefixtures("no_containers_after")
def test_failed_start_errors_its_node_and_a_crash_fails_fast_while_others_run(
        pytester: pytest.Pytester) -> None:
    # File order: the healthy node comes after both broken ones and must start normally.
    write_recipe(pytester.path, precisions=("fp8", "bf16", "fp4"), sim_options={
        "fp8": ("--error-rate", "7"),  # refuses to start: exit code 2
        "bf16": ("--fail-after-requests", "3", "--time-scale", "1"),  # dies in its first point
    })
    result = pytester.runpytest_subprocess(*FAST, "--junitxml=junit.xml")
    result.assert_outcomes(passed=2, failed=1, errors=3)
    outcome = junit_outcomes(pytester.path / "junit.xml")
    assert outcome["fp4-mi355x-atom-tp1::isl128-osl16-conc1"] == ("passed", "")
    assert outcome["fp4-mi355x-atom-tp1::isl128-osl16-conc2"] == ("passed", "")
    for conc in (1, 2):
        kind, text = outcome[f"fp8-mi355x-atom-tp1::isl128-osl16-conc{conc}"]
        assert kind == "error"
        assert "exited with code 2 before it became ready" in text
        assert "--error-rate 7" in text  # the log tail says why
    kind, text = outcome["bf16-mi355x-atom-tp1::isl128-osl16-conc1"]
    assert kind == "failure"
    assert "exited with code 3 during the sweep" in text
    assert "--fail-after-requests" in text
    kind, text = outcome["bf16-mi355x-atom-tp1::isl128-osl16-conc2"]
    assert (kind, "server died during an earlier point" in text) == ("error", True)


def junit_outcomes(path: Path) -> dict[str, tuple[str, str]]:
    """`<precision>-...-tp1::<point>` -> (passed | failure | error | skipped, message text)."""
    outcomes = {}
    for case in ElementTree.parse(path).iter("testcase"):
        key = case.get("name", "")
        node = case.get("classname", "").rsplit("minimaxm3-", 1)[-1]
        found = [(child.tag, f"{child.get('message', '')}\n{child.text or ''}")
                 for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[f"{node}::{key}"] = found[0] if found else ("passed", "")
    return outcomes


@pytest.mark.usefixtures("no_containers_after")
def test_a_python_test_shares_the_recipe_nodes_container(pytester: pytest.Pytester) -> None:
    write_recipe(pytester.path)
    pytester.makepyfile(test_bench="""
import httpx
import pytest


@pytest.mark.inferbench_server("minimaxm3-fp4-mi355x-atom", tp=1)
def test_a_point_on_the_container(inferbench_server, inferbench_load):
    assert httpx.get(inferbench_server.base_url + "/health").status_code == 200
    assert inferbench_load(isl=128, osl=16, conc=2).passed
""")
    result = pytester.runpytest_subprocess(*FAST, "--inferbench-results=results")
    result.assert_outcomes(passed=3)
    # One container for the recipe's two points and the Python test: one server log.
    logs = [p.name for p in (pytester.path / "results" / "server-logs").glob("*.log")]
    assert logs == ["minimaxm3-fp4-mi355x-atom-tp1.log"], logs


@pytest.mark.usefixtures("no_containers_after")
def test_xdist_loadscope_runs_each_node_once_on_one_worker_concurrently(
        pytester: pytest.Pytester, docker_client: Any) -> None:
    # The startup delay keeps both containers up long enough to see them overlap.
    write_recipe(pytester.path, tps=(1, 2), sim_options={"fp4": ("--startup-delay", "3")})
    since = time.time() - 1
    engine = "unix:///var/run/docker.sock"  # one engine per worker; here both are the local one
    result = pytester.runpytest_subprocess(*FAST, "-n", "2", "--dist", "loadscope", "-v",
                                           "--inferbench-results=results",
                                           f"--inferbench-docker-hosts={engine},{engine}")
    until = time.time() + 1
    result.assert_outcomes(passed=4)

    workers_of_node: dict[str, set[str]] = defaultdict(set)
    for worker, nodeid in re.findall(r"\[(gw\d+)\] .*?PASSED (\S+)", result.stdout.str()):
        workers_of_node[nodeid.split("::")[1]].add(worker)
    assert len(workers_of_node) == 2
    assert all(len(w) == 1 for w in workers_of_node.values()), workers_of_node

    starts: dict[str, list[float]] = defaultdict(list)
    dies: dict[str, float] = {}
    runs, workers = set(), {}
    for event in docker_client.events(since=since, until=until, decode=True,
                                      filters={"type": "container", "label": LABEL_NODE}):
        labels = event["Actor"]["Attributes"]
        node, when = labels[LABEL_NODE], event["timeNano"] / 1e9
        if event["Action"] == "start":
            starts[node].append(when)
            runs.add(labels[LABEL_RUN])
            workers[node] = labels[LABEL_WORKER]
        elif event["Action"] == "die":
            dies[node] = when
    assert set(starts) == set(workers_of_node)
    assert all(len(times) == 1 for times in starts.values()), starts  # no node started twice
    assert len(runs) == 1  # the workers share the controller's run id
    assert {workers[n] for n in workers} == {w for ws in workers_of_node.values() for w in ws}
    (a_start,), (b_start,) = starts.values()
    a_die, b_die = (dies[n] for n in starts)
    assert max(a_start, b_start) < min(a_die, b_die), "the two containers never ran together"

    ports = {re.search(r"listening on http://127.0.0.1:(\d+)", log.read_text()).group(1)  # type: ignore[union-attr]
             for log in (pytester.path / "results" / "server-logs").glob("*.log")}
    assert len(ports) == 2


@pytest.mark.parametrize("xdist", [(), ("-n", "2", "--dist", "loadscope")],
                         ids=["one-process", "xdist-2-workers"])
def test_sigterm_during_a_point_tears_the_containers_down(
        docker_client: Any, tmp_path: Path, xdist: tuple[str, ...]) -> None:
    # Real time and long outputs: the first points run for minutes unless interrupted.
    tps = (1, 2) if xdist else (1,)
    write_recipe(tmp_path, tps=tps, osl=4000, sim_options={"fp4": ("--time-scale", "1")})
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", *FAST, *xdist, "--inferbench-results=results",
         str(tmp_path / "test-master.yaml")],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)  # its own process group, as a CI job's
    try:
        log_dir = tmp_path / "results" / "server-logs"
        deadline = time.monotonic() + 90
        while sum("listening on" in p.read_text() for p in log_dir.glob("*.log")) < len(tps):
            assert proc.poll() is None, proc.communicate()[0].decode()
            assert time.monotonic() < deadline, "the servers never started"
            time.sleep(0.2)
        time.sleep(1.0)  # into the points' requests
        running = docker_client.containers.list(filters={"label": LABEL_RUN})
        runs = {c.labels[LABEL_RUN] for c in running if c.labels.get(LABEL_OWNER, "").startswith(
            socket.gethostname() + ":")}
        assert len(runs) == 1 and len(running) == len(tps), [c.name for c in running]
        os.killpg(proc.pid, signal.SIGTERM)  # a CI cancel signals the whole job
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 2, output  # pytest's "interrupted"
    assert "KeyboardInterrupt" in output
    (run,) = runs
    left = docker_client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run}"})
    for container in left:
        container.remove(force=True)
    assert not left, f"SIGTERM left containers behind: {[c.name for c in left]}"
