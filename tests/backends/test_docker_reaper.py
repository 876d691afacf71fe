"""Stale-container sweep and idempotent stops against a real Docker Engine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

import pytest

from pytest_inferbench.backends.docker import MOUNTS_ENV, parse_mounts
from pytest_inferbench.backends.reaper import (
    LABEL_OWNER,
    LABEL_RUN,
    owner_label,
    stop_container,
    sweep_client,
)

pytestmark = pytest.mark.docker


def start_sleeper(client: Any, image: str, run_id: str, owner: str) -> Any:
    return client.containers.run(
        image, entrypoint=["sleep"], command=["600"], detach=True, network_mode="host",
        init=True, labels={LABEL_RUN: run_id, LABEL_OWNER: owner},
        volumes=parse_mounts(os.environ[MOUNTS_ENV]))


@pytest.mark.usefixtures("no_leftovers")
def test_sweep_removes_containers_whose_owner_died_and_keeps_the_others(
        docker_client: Any, sim_mounts: str, run_id: str) -> None:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    host = socket.gethostname()
    stale = start_sleeper(docker_client, sim_mounts, run_id, f"{host}:{finished.pid}")
    live = start_sleeper(docker_client, sim_mounts, run_id, owner_label())
    foreign = start_sleeper(docker_client, sim_mounts, run_id, f"not-{host}:{finished.pid}")
    try:
        removed = sweep_client(docker_client)
        names = {c.name for c in docker_client.containers.list(
            all=True, filters={"label": f"{LABEL_RUN}={run_id}"})}
        assert stale.name in removed
        assert names == {live.name, foreign.name}
    finally:
        for container in (stale, live, foreign):
            stop_container(container, grace_s=0)


@pytest.mark.usefixtures("no_leftovers")
def test_stop_is_idempotent_and_tolerates_a_removed_container(
        docker_client: Any, sim_mounts: str, run_id: str) -> None:
    container = start_sleeper(docker_client, sim_mounts, run_id, owner_label())
    stop_container(container, grace_s=1)
    stop_container(container, grace_s=1)  # already gone: no error
    assert not docker_client.containers.list(all=True, filters={"id": container.id})


def test_plugin_sweeps_stale_containers_at_session_start(
        docker_client: Any, sim_mounts: str, pytester: pytest.Pytester, run_id: str) -> None:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    stale = start_sleeper(docker_client, sim_mounts, run_id,
                          f"{socket.gethostname()}:{finished.pid}")
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                               "--inferbench-backend", "docker")
        result.stdout.fnmatch_lines([f"inferbench: removed stale container {stale.name}*"])
        assert not docker_client.containers.list(all=True, filters={"id": stale.id})
    finally:
        stop_container(stale, grace_s=0)
