"""Run metadata for summary.json: plugin version, backend, git commit, host, engine, images."""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from typing import TYPE_CHECKING

from ..results.redact import Redactor
from ..state import get_session_state

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pytest

    from ..options import Settings
    from .tables import Row


def git_commit(cwd: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", cwd, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def docker_engine(host: str | None) -> dict[str, object] | None:
    """Version facts of the Docker Engine used, or None when it cannot be reached."""
    try:
        import docker

        client = (
            docker.DockerClient(base_url=host, timeout=5) if host else docker.from_env(timeout=5)
        )
        version = client.version()
        client.close()
    except Exception:  # metadata is best effort: any engine problem already failed the run
        return None
    return {
        "version": version.get("Version"),
        "api_version": version.get("ApiVersion"),
        "os": version.get("Os"),
        "arch": version.get("Arch"),
    }


def run_metadata(
    config: pytest.Config, settings: Settings, points: Sequence[Row], started: float
) -> dict[str, object]:
    redactor = Redactor.from_env(settings.pass_env, urls=(settings.base_url,))
    simulated = settings.simulated or any(
        p.get("simulated") is True for p in points
    )
    return {
        "plugin": "pytest-inferbench",
        "plugin_version": metadata.version("pytest-inferbench"),
        "run_id": get_session_state(config).run_id,
        "backend": settings.backend,
        "simulated": simulated,
        "git_commit": git_commit(str(config.rootpath)),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "docker_engine": docker_engine(settings.docker_host)
        if settings.backend == "docker"
        else None,
        "images": sorted({str(p["image"]) for p in points if p.get("image")}),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # Secrets the servers receive (HF_TOKEN, ...) never reach the summary, even via argv.
        "args": [redactor.text(str(a)) for a in config.invocation_params.args],
        "points": len(points),
        "failed_points": sum(p.get("verdict") in ("failed", "error") for p in points),
    }
