"""Pure parts of the server lifecycle: redaction, GPU slicing and presets, xdist worker input."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_inferbench import state
from pytest_inferbench.backends import gpu
from pytest_inferbench.backends.base import ServerStartError
from pytest_inferbench.backends.docker import (
    CONTAINER_HF_CACHE,
    hf_cache_mount,
    parse_mounts,
    server_address,
)
from pytest_inferbench.backends.readiness import log_path_for
from pytest_inferbench.backends.reaper import LABEL_OWNER, is_stale
from pytest_inferbench.options import Settings
from pytest_inferbench.plugin import xdist_hooks
from pytest_inferbench.results.redact import Redactor


def test_redactor_masks_values_and_names_the_variable() -> None:
    redactor = Redactor.from_env(["HF_TOKEN", "OTHER", "SHORT"],
                                 {"HF_TOKEN": "hf_abcdef123456", "SHORT": "1", "UNUSED": "x"})
    text = "Authorization: Bearer hf_abcdef123456 and again hf_abcdef123456"
    assert redactor.text(text) == "Authorization: Bearer ***HF_TOKEN*** and again ***HF_TOKEN***"
    # A value too short to be a token would mask ordinary text, so it is not a secret.
    assert redactor.text("tp=1") == "tp=1"
    masked = redactor.mapping({"HF_TOKEN": "hf_abcdef123456", "URL": "x?t=hf_abcdef123456"})
    assert masked == {"HF_TOKEN": "***HF_TOKEN***", "URL": "x?t=***HF_TOKEN***"}


def test_longer_secret_is_replaced_before_its_prefix() -> None:
    redactor = Redactor.from_env(["A", "B"], {"A": "secret", "B": "secret-and-more"})
    assert redactor.text("secret-and-more") == "***B***"


@pytest.mark.parametrize(("text", "ids"), [
    ("0-7", tuple(range(8))), ("0-1,4,6-7", (0, 1, 4, 6, 7)), ("3", (3,)), ("", ()),
])
def test_parse_gpu_ids(text: str, ids: tuple[int, ...]) -> None:
    assert gpu.parse_gpu_ids(text) == ids


@pytest.mark.parametrize("text", ["a", "3-1", "0-2,2", "-1"])
def test_bad_gpu_ids_are_clear_errors(text: str) -> None:
    with pytest.raises(gpu.GpuSpecError, match="GPU ids"):
        gpu.parse_gpu_ids(text)


def test_workers_get_disjoint_equal_slices_and_nodes_take_their_tp() -> None:
    slices = gpu.split_between_workers(tuple(range(8)), 3)
    assert slices == [(0, 1), (2, 3), (4, 5)]
    flat = [i for s in slices for i in s]
    assert len(flat) == len(set(flat))
    assert gpu.node_gpu_ids((4, 5, 6, 7), 2, "n") == (4, 5)
    with pytest.raises(gpu.GpuSpecError, match="needs 8 GPU"):
        gpu.node_gpu_ids((4, 5, 6, 7), 8, "n")


def test_no_preset_without_devices_or_explicit_ids() -> None:
    assert gpu.preset_for_node("MI355X", 4, None, "n", devices_present=False) is None
    preset = gpu.preset_for_node("MI355X", 2, "4-7", "n", devices_present=False)
    assert preset == gpu.GpuPreset("rocm", (4, 5))
    kwargs = preset.docker_kwargs()
    assert kwargs["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    assert kwargs["group_add"] == ["video", "render"]
    assert kwargs["ipc_mode"] == "host"
    assert kwargs["security_opt"] == ["seccomp=unconfined"]
    assert kwargs["cap_add"] == ["SYS_PTRACE"]
    assert kwargs["environment"]["HIP_VISIBLE_DEVICES"] == "4,5"


def test_nvidia_preset_requests_the_node_gpu_ids() -> None:
    preset = gpu.preset_for_node("H200", 2, None, "n", devices_present=True)
    assert preset is not None
    (request,) = preset.docker_kwargs()["device_requests"]
    assert request["DeviceIDs"] == ["0", "1"]
    assert request["Capabilities"] == [["gpu"]]


def settings_with(config: pytest.Config, **changes: object) -> Settings:
    return dataclasses.replace(Settings.from_config(config), **changes)  # type: ignore[arg-type]


def test_worker_input_slices_gpus_and_assigns_docker_hosts(pytestconfig: pytest.Config) -> None:
    settings = settings_with(pytestconfig, gpus="0-7",
                             docker_hosts=("tcp://a:2375", "tcp://b:2375"))
    inputs = [xdist_hooks.worker_input(settings, "run1", f"gw{i}", 2) for i in range(2)]
    assert [i[xdist_hooks.GPUS_KEY] for i in inputs] == ["0,1,2,3", "4,5,6,7"]
    assert [i[xdist_hooks.DOCKER_HOST_KEY] for i in inputs] == ["tcp://a:2375", "tcp://b:2375"]
    assert {i[xdist_hooks.RUN_ID_KEY] for i in inputs} == {"run1"}
    worker = state.worker_settings(settings, inputs[1])
    assert (worker.gpus, worker.docker_host) == ("4,5,6,7", "tcp://b:2375")
    assert state.worker_settings(settings, None) is settings


def test_too_few_gpus_for_the_workers_leaves_each_worker_none(pytestconfig: pytest.Config) -> None:
    settings = settings_with(pytestconfig, gpus="0")
    values = xdist_hooks.worker_input(settings, "r", "gw1", 2)
    assert values[xdist_hooks.GPUS_KEY] == ""
    with pytest.raises(gpu.GpuSpecError, match="this worker has 0"):
        gpu.preset_for_node("MI355X", 1, "", "node-a", devices_present=False)


def test_mounts_parse_read_only_by_default_and_reject_bad_entries() -> None:
    assert parse_mounts("/a:/b, /c:/d:rw") == {
        "/a": {"bind": "/b", "mode": "ro"}, "/c": {"bind": "/d", "mode": "rw"}}
    for bad in ("/a", "/a:/b:xx", ":/b"):
        with pytest.raises(ServerStartError, match="INFERBENCH_DOCKER_MOUNTS"):
            parse_mounts(bad)


def test_only_dead_owners_on_this_host_are_stale(tmp_path: Path) -> None:
    import os
    import socket
    import subprocess
    import sys

    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    host = socket.gethostname()
    assert is_stale({LABEL_OWNER: f"{host}:{finished.pid}"})
    assert not is_stale({LABEL_OWNER: f"{host}:{os.getpid()}"})
    assert not is_stale({LABEL_OWNER: f"elsewhere:{finished.pid}"})
    assert not is_stale({})


def test_log_paths_are_unique_per_node_and_worker(tmp_path: Path) -> None:
    taken: set[Path] = set()
    first = log_path_for(tmp_path, "key-tp4 / x", "gw0", taken)
    second = log_path_for(tmp_path, "key-tp4 / x", "gw0", taken)
    assert first.parent == tmp_path / "server-logs"
    assert first != second
    assert "/" not in first.name.replace(str(tmp_path), "")


def test_hf_cache_is_mounted_only_when_it_exists(tmp_path: Path) -> None:
    volumes, env = hf_cache_mount({"HF_HUB_CACHE": str(tmp_path)})
    assert volumes == {str(tmp_path): {"bind": CONTAINER_HF_CACHE, "mode": "rw"}}
    assert env == {"HF_HUB_CACHE": CONTAINER_HF_CACHE}
    assert hf_cache_mount({"HF_HUB_CACHE": str(tmp_path / "absent")}) == ({}, {})


@pytest.mark.parametrize(("host", "address"), [
    (None, "127.0.0.1"), ("unix:///var/run/docker.sock", "127.0.0.1"),
    ("tcp://gpu-box-3:2376", "gpu-box-3"), ("ssh://ci@10.0.0.7", "10.0.0.7"),
])
def test_servers_are_reached_on_the_engine_machine(host: str | None, address: str) -> None:
    assert server_address(host) == address


def test_a_bad_gpu_list_reaches_the_workers_unchanged_to_fail_each_node_clearly(
        pytestconfig: pytest.Config) -> None:
    settings = settings_with(pytestconfig, gpus="0-x")
    values = xdist_hooks.worker_input(settings, "r", "gw0", 2)
    assert values[xdist_hooks.GPUS_KEY] == "0-x"
    with pytest.raises(gpu.GpuSpecError, match="'0-x'"):
        gpu.preset_for_node("H200", 1, values[xdist_hooks.GPUS_KEY], "n", devices_present=False)


def test_sim_image_mounts_cover_python_and_the_project_without_nesting() -> None:
    import sys
    import tarfile
    from io import BytesIO

    from pytest_inferbench.testing import simimage

    mounts = [Path(p) for p in simimage.host_mounts()]
    assert not [(a, b) for a in mounts for b in mounts if a != b and a in b.parents]
    for needed in (Path(sys.executable).resolve(), simimage.project_root()):
        assert any(m == needed or m in needed.parents for m in mounts), needed
    with tarfile.open(fileobj=BytesIO(simimage.rootfs_tar())) as tar:
        names = tar.getnames()
    assert {"tmp", "etc/passwd", "sbin"} <= set(names)
    assert simimage.rootfs_tar() == simimage.rootfs_tar()  # deterministic: the digest is stable
