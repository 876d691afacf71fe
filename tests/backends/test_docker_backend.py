"""The docker backend against a real engine serving the simulator image: start, points, stop."""

from __future__ import annotations

import re
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from lifecycle_helpers import (
    assert_never_ready_message,
    containers_of_run,
    load_node,
    with_settings,
    write_recipe,
)

from pytest_inferbench.backends import gpu
from pytest_inferbench.backends.base import LoadSettings, ServerDiedError, ServerStartError
from pytest_inferbench.backends.docker import DockerBackend, run_kwargs
from pytest_inferbench.backends.reaper import LABEL_NODE, LABEL_OWNER, LABEL_RUN, LABEL_WORKER

if TYPE_CHECKING:
    from pathlib import Path

    from pytest_inferbench.backends.base import StartContext

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("sim_mounts", "no_leftovers")]

LOAD = LoadSettings(prompts_per_conc=2, warmup_per_conc=1)
SECRET = "hf_" + uuid.uuid4().hex  # a fresh value, so a hit can only come from this test


def test_points_run_in_a_labelled_host_network_container(
        docker_client: Any, tmp_path: Path, start_context: StartContext, run_id: str) -> None:
    server, spec = load_node(write_recipe(tmp_path))
    handle = DockerBackend().start(server, spec, start_context)
    try:
        (container,) = containers_of_run(docker_client, run_id)
        port = handle.base_url.rsplit(":", 1)[1]
        argv = list(spec.argv_for_port(int(port)))
        config = container.attrs["Config"]
        assert [*config["Entrypoint"], *config["Cmd"]] == argv
        assert container.attrs["HostConfig"]["NetworkMode"] == "host"
        assert "INFERBENCH_TEST_ENV=visible" in config["Env"]
        assert container.labels[LABEL_RUN] == run_id
        assert container.labels[LABEL_WORKER] == "master"
        assert container.labels[LABEL_NODE] == server.node_name
        assert LABEL_OWNER in container.labels
        measurement = handle.run_point(server.points()[0], LOAD)
        assert measurement.num_prompts == 2 * server.points()[0].conc
        assert all(r.success for r in measurement.records), [r.error for r in measurement.records]
        assert measurement.simulated  # the image serves the simulator, and its answers say so
        handle.check_alive()
    finally:
        handle.stop()
        handle.stop()  # idempotent
    log = next((tmp_path / "server-logs").glob("*.log")).read_text()
    assert log.strip(), "the container's output should be in the log file"


def test_model_with_shell_syntax_is_one_literal_argv_element(
        tmp_path: Path, start_context: StartContext) -> None:
    marker = tmp_path / "pwned"
    model = f"x; touch {marker}"
    server, spec = load_node(write_recipe(tmp_path, model=model))
    words = run_kwargs(server, spec, start_context, 8000)["command"]
    assert words[words.index("--model") + 1] == model
    # The simulator knows only real model names: its refusal quotes the value it received,
    # whole, as one argument -- no shell ever split it or ran the `touch`.
    with pytest.raises(ServerStartError, match=re.escape(f"unknown model {model!r}")):
        DockerBackend().start(server, spec, start_context)
    assert not marker.exists()


def test_never_ready_fails_at_the_startup_timeout_with_the_log_tail(
        tmp_path: Path, start_context: StartContext) -> None:
    recipe = write_recipe(tmp_path, sim_options={"fp4": ("--never-ready",)}, timeout=3)
    server, spec = load_node(recipe)
    started = time.monotonic()
    with pytest.raises(ServerStartError) as failure:
        DockerBackend().start(server, spec, start_context)
    elapsed = time.monotonic() - started
    message = str(failure.value)
    assert_never_ready_message(message, 3)
    assert "--- last log lines ---" in message
    assert elapsed < 3 + 15, elapsed  # the timeout bounds the wait; stopping adds a little


def test_server_that_exits_early_fails_fast_with_exit_code_and_log(
        tmp_path: Path, start_context: StartContext) -> None:
    # An out-of-range fault rate makes the simulator refuse to start, like a bad engine flag.
    recipe = write_recipe(tmp_path, sim_options={"fp4": ("--error-rate", "7")}, timeout=120)
    server, spec = load_node(recipe)
    started = time.monotonic()
    with pytest.raises(ServerStartError) as failure:
        DockerBackend().start(server, spec, start_context)
    message = str(failure.value)
    assert "exited with code 2" in message
    assert "--error-rate 7" in message.split("--- last log lines ---")[1]
    assert time.monotonic() - started < 60  # not the 120 s startup timeout


def test_server_dying_mid_sweep_raises_server_died_with_log_tail(
        docker_client: Any, tmp_path: Path, start_context: StartContext, run_id: str) -> None:
    # Real time, so requests are still streaming when the server exits after the third.
    recipe = write_recipe(tmp_path, sim_options={
        "fp4": ("--fail-after-requests", "3", "--time-scale", "1")})
    server, spec = load_node(recipe)
    handle = DockerBackend().start(server, spec, start_context)
    try:
        with pytest.raises(ServerDiedError) as died:
            handle.run_point(server.points()[-1], LOAD)
        assert "exited with code 3" in str(died.value)
        assert "--- last log lines ---" in str(died.value)
        with pytest.raises(ServerDiedError):
            handle.check_alive()
    finally:
        handle.stop()


def test_secret_values_never_reach_logs_or_errors(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, start_context: StartContext) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    recipe = write_recipe(tmp_path, sim_options={"fp4": ("--never-ready",)}, leak_token=True,
                          timeout=3)
    server, spec = load_node(recipe)
    with pytest.raises(ServerStartError) as failure:
        DockerBackend().start(server, spec, start_context)
    assert SECRET not in str(failure.value)
    assert "token ***HF_TOKEN***" in str(failure.value)  # it was passed through, and masked
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path


def test_image_problems_are_clear_start_errors(
        tmp_path: Path, start_context: StartContext) -> None:
    server, spec = load_node(write_recipe(tmp_path, image="inferbench-absent:none"))
    with pytest.raises(ServerStartError, match="not present and --inferbench-skip-pull"):
        DockerBackend().start(server, spec, with_settings(start_context, skip_pull=True))
    unreachable = "127.0.0.1:9/inferbench/none:tag"
    server, spec = load_node(write_recipe(tmp_path, image=unreachable))
    with pytest.raises(ServerStartError, match=re.escape(f"cannot pull image {unreachable}")):
        DockerBackend().start(server, spec, start_context)
    server, spec = load_node(write_recipe(tmp_path, image="Upper/Case:tag"))
    with pytest.raises(ServerStartError, match=r"image Upper/Case:tag: .*invalid reference"):
        DockerBackend().start(server, spec, start_context)


@pytest.mark.skipif(gpu.ROCM_DEVICE.exists(), reason="this host has ROCm GPUs")
def test_explicit_gpu_ids_apply_the_rocm_preset_which_needs_the_devices(
        docker_client: Any, tmp_path: Path, start_context: StartContext, run_id: str) -> None:
    server, spec = load_node(write_recipe(tmp_path, tps=(2,)))
    kwargs = run_kwargs(server, spec, with_settings(start_context, gpus="4-7"), 8000)
    assert kwargs["environment"]["HIP_VISIBLE_DEVICES"] == "4,5"
    # No /dev/kfd here: the engine refuses the device, and the error names it.
    with pytest.raises(ServerStartError, match="/dev/kfd"):
        DockerBackend().start(server, spec, with_settings(start_context, gpus="4-7"))
    assert not containers_of_run(docker_client, run_id)
