"""Fixtures for the server-lifecycle tests: a real Docker Engine, the simulator image, a
real Slurm (`/work/shared/scripts/start-slurm.sh`, one host).

Tests that need Docker skip with the reason when no engine answers; CI starts one
(`/work/shared/scripts/start-dockerd.sh`, loopback only, host networking).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from lifecycle_helpers import cancel_jobs, containers_of_run, jobs_of_run

from pytest_inferbench.backends.base import StartContext
from pytest_inferbench.backends.docker import MOUNTS_ENV
from pytest_inferbench.options import Settings, SlurmSettings
from pytest_inferbench.testing import simimage

if TYPE_CHECKING:
    from collections.abc import Iterator


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


# --- Slurm ---------------------------------------------------------------------------------

# What every test allocation asks for on the one-host test cluster: no gres (it has no GPUs),
# a small memory share and shared CPUs, so the tests' allocations (and xdist's) run together.
SLURM_TEST_SETTINGS = SlurmSettings(gres="", args=("--mem=256M", "--oversubscribe"), time="10")


@pytest.fixture(scope="session")
def slurm() -> None:
    """A Slurm that answers; skip with the reason where none can run. CI starts one."""
    import subprocess

    try:
        done = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True,
                              text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"no Slurm here ({type(exc).__name__}: {exc}); "
                    "start one with /work/shared/scripts/start-slurm.sh")
    if done.returncode != 0 or not re.search(r"idle|mix|alloc", done.stdout):
        pytest.skip(f"Slurm does not answer (sinfo: {done.stderr.strip() or done.stdout.strip()})"
                    "; start one with /work/shared/scripts/start-slurm.sh")


@pytest.fixture
def slurm_context(slurm: None, start_context: StartContext) -> StartContext:
    return dataclasses.replace(start_context, options=dataclasses.replace(
        start_context.options, slurm=SLURM_TEST_SETTINGS))


@pytest.fixture
def no_jobs_left(slurm: None, run_id: str) -> Iterator[None]:
    """After the test: no Slurm job of this run in squeue."""
    yield
    left = jobs_of_run(run_id)
    if left:
        cancel_jobs(left)
    assert not left, f"slurm jobs left behind: {left}"


FAKE_ENROOT = """#!{python}
import sys, pathlib
calls = pathlib.Path({calls!r})
calls.write_text(calls.read_text() + " ".join(sys.argv[1:]) + "\\n" if calls.exists() else
                 " ".join(sys.argv[1:]) + "\\n")
if "fail" in sys.argv[-1]:
    print("[ERROR] URI docker://fail: 401 Unauthorized", flush=True)
    sys.exit(1)
pathlib.Path(sys.argv[3]).write_bytes(b"hsqs")
print("[INFO] Creating squashfs filesystem...", flush=True)
"""


@pytest.fixture
def fake_enroot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`enroot` on PATH as a stand-in (no registry is reachable here): `import -o FILE URI`
    writes FILE, or fails for a URI with 'fail'; every call is appended to the returned file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "enroot-calls"
    script = bin_dir / "enroot"
    script.write_text(FAKE_ENROOT.format(python=sys.executable, calls=str(calls)))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls
