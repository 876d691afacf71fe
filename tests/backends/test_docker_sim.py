"""`--inferbench-docker-sim`: the docker backend's whole flow with the simulator in place of the
image's server, from the locally built simulator image (no pull, no GPU, no mounts to set)."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

import pytest
from lifecycle_helpers import RECIPE

from pytest_inferbench.backends import simimage
from pytest_inferbench.backends.reaper import LABEL_NODE, LABEL_OWNER, LABEL_RUN, LABEL_WORKER
from pytest_inferbench.results.point_files import point_record

if TYPE_CHECKING:
    from pathlib import Path

# An image no engine here has or can pull: only the simulator image may run.
ABSENT_IMAGE = "rocm/atom:inferbench-absent"
# The real ATOM command line, nothing of the simulator in it: the option puts it in front. The
# model directory of the GPU box does not exist here: the simulator needs none.
ATOM_LAUNCH = """\
command: [python3, -m, atom.entrypoints.openai_server]
args: [--model, "{model}", --server-port, "{port}", -tp, "{tp}", --max-model-len, "4096"]
mounts: [/inferbench-absent/models:/models:ro]
health-path: /health
startup-timeout: 60
"""


def write_atom_recipe(directory: Path, runner: str = "mi355x") -> None:
    rows = "          - { tp: 1, conc-start: 1, conc-end: 2 }"
    (directory / "test-master.yaml").write_text(
        RECIPE.format(precision="fp4", image=ABSENT_IMAGE, model="amd/MiniMax-M3-MXFP4",
                      osl=16, rows=rows)
        .replace("isl: 128", "isl: 256").replace("runner: mi355x", f"runner: {runner}"))
    (directory / "launch").mkdir()
    (directory / "launch" / "minimaxm3_fp4_mi355x_atom.yaml").write_text(ATOM_LAUNCH)


def container_events(client: Any, run_id: str, since: float) -> dict[str, list[dict[str, str]]]:
    """The engine's own record of this run's containers: action -> the attributes (labels,
    image, name) of each event."""
    events = client.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                           filters={"type": "container", "label": f"{LABEL_RUN}={run_id}"})
    found: dict[str, list[dict[str, str]]] = {}
    for event in events:
        found.setdefault(event["Action"], []).append(event["Actor"]["Attributes"])
    return found


@pytest.mark.docker
def test_docker_sim_runs_the_docker_flow_on_the_simulator_image_and_says_simulated(
        pytester: pytest.Pytester, docker_client: Any) -> None:
    write_atom_recipe(pytester.path)
    started = time.time()
    result = pytester.runpytest("-p", "no:cacheprovider", "--inferbench-backend", "docker",
                                "--inferbench-docker-sim", "--inferbench-time-scale", "0",
                                "--inferbench-prompts-per-conc", "2",
                                "--inferbench-results=results")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert "inferbench: SIMULATED results" in out, out  # the run header
    result.stdout.fnmatch_lines(["minimaxm3-fp4-mi355x-atom-tp1  [[]SIMULATED: *"])  # its table
    summary = json.loads((pytester.path / "results" / "summary.json").read_text())
    meta = summary["metadata"]
    assert meta["simulated"] is True and meta["backend"] == "docker", meta
    points = summary["points"]
    assert sorted(p["conc"] for p in points) == [1, 2]
    assert all(p["simulated"] is True for p in points), points
    aggs = list((pytester.path / "results" / "points").glob("agg_*.json"))
    # At time scale 0 a point's TPOT can be 0, which InferenceX's process_result.py divides by:
    # that point's agg file is left unwritten (README), its raw file is not; those written say
    # simulated.
    assert len(aggs) <= 2
    raws = list((pytester.path / "results" / "points").glob("minimaxm3*.json"))
    assert len(raws) == 2
    # Each carries the error expected of its regime, as the in-process simulator's points do.
    for raw in raws:
        record = point_record(json.loads(raw.read_text()))
        assert record["expected_error"] and record["expected_error_label"], record
    assert all(json.loads(a.read_text())["inferbench"] == {"simulated": True} for a in aggs)

    events = container_events(docker_client, meta["run_id"], started)
    (created,) = events["create"]  # one server node, one container
    assert created["image"] == simimage.IMAGE  # never the recipe's image
    assert created[LABEL_NODE] == "minimaxm3-fp4-mi355x-atom-tp1"
    assert created[LABEL_WORKER] == "master"
    assert created[LABEL_OWNER].endswith(f":{os.getpid()}")  # in process: this pytest
    assert len(events.get("destroy", [])) == 1, events  # removed at teardown
    assert not docker_client.containers.list(  # others' runs may share the engine
        all=True, filters={"label": f"{LABEL_RUN}={meta['run_id']}"})
    import docker.errors

    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(ABSENT_IMAGE)  # nothing was pulled


@pytest.mark.parametrize("how", ["option", "ini"])
def test_docker_sim_with_another_backend_is_a_usage_error(pytester: pytest.Pytester,
                                                          how: str) -> None:
    write_atom_recipe(pytester.path)
    if how == "ini":
        pytester.makeini("[pytest]\ninferbench_docker_sim = true\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--inferbench-backend", "sim-server",
        *(["--inferbench-docker-sim"] if how == "option" else []))
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    source = "--inferbench-docker-sim" if how == "option" else "ini inferbench_docker_sim = true"
    assert (f"{source} runs the simulator inside docker containers: it needs "
            "--inferbench-backend docker (this run's backend: sim-server)") in text, text
    assert "Traceback" not in text
    assert not (pytester.path / "inferbench-results").exists()


def test_docker_sim_refuses_a_runner_the_simulator_lacks_before_any_start(
        pytester: pytest.Pytester) -> None:
    """The plain docker backend runs any runner's image; with the simulator inside, preflight
    holds the runners to the simulator's catalog, as for the sim backends."""
    pytester.makeconftest(  # a runner the recipes accept, unknown to the simulator
        "from pytest_inferbench.recipe.model import GPU_BY_RUNNER_PREFIX\n"
        "GPU_BY_RUNNER_PREFIX['tpu7'] = 'TPU7'\n")
    write_atom_recipe(pytester.path, runner="tpu7-pod")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-backend",
                                           "docker", "--inferbench-docker-sim")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert ("runner 'tpu7-pod': the docker backend cannot simulate it: unknown hardware "
            "'TPU7'") in text, text
    assert "Traceback" not in text


def test_docker_sim_refuses_a_remote_engine() -> None:
    """The image borrows this machine's Python: another machine's engine has no such paths."""
    from pytest_inferbench.backends.base import ServerStartError
    from pytest_inferbench.backends.docker import sim_image
    from pytest_inferbench.results.redact import Redactor

    with pytest.raises(ServerStartError, match=r"needs a local Docker Engine .* not "
                                               r"tcp://gpu-box-3:2376"):
        sim_image(object(), "tcp://gpu-box-3:2376", Redactor.from_env(()))  # type: ignore[arg-type]
