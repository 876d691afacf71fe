"""Fixtures for the server-lifecycle tests: a real Docker Engine, the simulator image.

Tests that need Docker skip with the reason when no engine answers; CI starts one
(`/work/shared/scripts/start-dockerd.sh`, loopback only, host networking).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from lifecycle_helpers import containers_of_run

from pytest_inferbench.backends.base import StartContext
from pytest_inferbench.backends.docker import MOUNTS_ENV
from pytest_inferbench.options import Settings
from pytest_inferbench.testing import simimage

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def run_id() -> str:
    return "t" + uuid.uuid4().hex[:11]


@pytest.fixture
def start_context(pytestconfig: pytest.Config, tmp_path: Path, run_id: str) -> StartContext:
    settings = dataclasses.replace(Settings.from_config(pytestconfig), results_dir=tmp_path,
                                   time_scale=0.0, startup_timeout_s=None)
    return StartContext(results_dir=tmp_path, run_id=run_id, worker_id="master",
                        options=settings)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker Engine answers ({type(exc).__name__}: {exc}); "
                    "start one with /work/shared/scripts/start-dockerd.sh")
    yield client
    client.close()


@pytest.fixture(scope="session")
def sim_image(docker_client: Any) -> str:
    return simimage.ensure_image(docker_client)


@pytest.fixture
def sim_mounts(monkeypatch: pytest.MonkeyPatch, sim_image: str) -> str:
    monkeypatch.setenv(MOUNTS_ENV, simimage.mounts_value())
    return sim_image


@pytest.fixture
def no_leftovers(docker_client: Any, run_id: str) -> Iterator[None]:
    """After the test: `docker ps -a --filter label=inferbench.run=<run>` must be empty."""
    yield
    left = containers_of_run(docker_client, run_id)
    for container in left:
        container.remove(force=True)
    assert not left, f"containers left behind: {[c.name for c in left]}"
