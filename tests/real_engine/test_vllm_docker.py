"""The same vLLM through the docker backend: a container started, measured and removed.

No registry is reachable here, so the recipe's image (`vllm-cpu:<version>`) is built locally:
the simulator image's tiny root file system (`backends/simimage.py`), with this host's Python
installation bind-mounted read-only (`INFERBENCH_DOCKER_MOUNTS`) and the venv with vLLM and the
model mounted by the launch spec's own `mounts:`. The container runs the launch spec's argv on
the host network, as a vLLM image would.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from vllm_helpers import SERVER_CPU, CpuProject, run_plugin

from pytest_inferbench.backends import simimage
from pytest_inferbench.backends.docker import MOUNTS_ENV

pytestmark = pytest.mark.real_engine

NODE = "cpu-master.yaml::tinyllama-bf16-cpu-vllm-tp1::isl128-osl32-conc4"


def docker_client() -> Any:
    """The local Docker Engine, or the test fails saying none answers (the tier never skips)."""
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.fail(f"no Docker Engine answers ({type(exc).__name__}: {exc}); start one with "
                    "../shared/scripts/start-dockerd.sh", pytrace=False)
    return client


def recipe_image(project: CpuProject) -> str:
    found = re.search(r"^\s+image: (\S+)$", (project.path / "cpu-master.yaml").read_text(), re.M)
    assert found is not None
    return found.group(1)


def test_docker_backend_starts_measures_and_stops_vllm(cpu_project: CpuProject,
                                                      tmp_path: Path) -> None:
    client = docker_client()
    image = simimage.ensure_image(client, tag=recipe_image(cpu_project))
    run = run_plugin(cpu_project, tmp_path / "results", "--inferbench-backend=docker",
                     "--inferbench-skip-pull", "-m", "not eval", "-k", "not mtp and conc4",
                     env={MOUNTS_ENV: simimage.mounts_value()})
    text = run.output
    # Stopped and removed, whatever the point's verdict: no container of the image is left.
    assert client.containers.list(all=True, filters={"ancestor": image}) == []
    client.close()
    # A server that died or never answered fails the point with its log tail (the output).
    points = run.points()
    assert "conc4" in points, text
    raw = points["conc4"]
    info: dict[str, Any] = raw["inferbench"]  # type: ignore[assignment]
    assert info["simulated"] is False, info
    assert raw["completed"] == raw["num_prompts"] > 0, text
    assert raw["total_output_tokens"] == info["server_metrics"]["counter_deltas"][
        "vllm:generation_tokens_total"]
    # The container's processes are this host's: the client found the server by its port and
    # kept off the CPU the launch spec binds it to.
    check = info["client_check"]
    assert f"off the local server's bound CPUs [{SERVER_CPU}]" in check["client_cpu_choice"]
    print(f"docker: {raw['output_throughput']:.0f} output tok/s, median TPOT "
          f"{raw['median_tpot_ms']:.3f} ms, {run.elapsed_s:.0f} s in all, client self-check "
          f"{'ok' if check['ok'] else check.get('reason')} (load average "
          f"{Path('/proc/loadavg').read_text().split()[0]})")
    assert f"PASSED {NODE}" in text, text
