"""Container mode: the launch spec's image run by pyxis, imported once per image by enroot.

As InferenceX's Slurm runners do: `enroot import -o <dir>/<image>.sqsh docker://<image>` on the
machine running pytest (the squash directory must be visible to the compute nodes), one import
per image at a time across processes (a lock file beside the image), skipped when the file is
there (imports write to a temporary name and rename, so an existing file is complete). The
server then runs as `srun --container-image=<file> --container-mounts=... --container-writable
--container-workdir=... --container-remap-root --no-container-entrypoint`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..base import ServerStartError
from ..docker import CONTAINER_HF_CACHE, host_hf_hub

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from ...options import SlurmSettings

IMPORT_LOCK_WAIT_S = 600.0  # another process importing the same image (InferenceX: flock -w 600)
IMPORT_TIMEOUT_S = 3600.0


def squash_path(squash_dir: Path, image: str) -> Path:
    """`<dir>/<image with / : @ # as _>.sqsh` (InferenceX's naming)."""
    return squash_dir / (re.sub(r"[/:@#]", "_", image) + ".sqsh")


def enroot_uri(image: str) -> str:
    """A docker reference as enroot spells it: `docker://[REGISTRY#]IMAGE[:TAG]`.

    enroot separates a registry host from the path with `#`; a first path part with a dot, a
    port or `localhost` is a registry host, as docker reads references.
    """
    first, slash, rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return f"docker://{first}#{rest}"
    return f"docker://{image}"


def enroot_import_argv(image: str, output: Path) -> tuple[str, ...]:
    return ("enroot", "import", "--output", str(output), enroot_uri(image))


def pyxis_mount(entry: str) -> str:
    """A launch spec mount `host:container[:ro|rw]` in pyxis' form. Read-only unless `:rw`,
    as in the docker backend; pyxis' own default is read-write, so `ro` is always written."""
    parts = entry.split(":")
    return ":".join(parts[:2]) + ("" if parts[2:] == ["rw"] else ":ro")


def container_args(squash: Path, settings: SlurmSettings, spec_mounts: Sequence[str],
                   environ: Mapping[str, str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """(srun words, environment for the step): the image, mounts, workdir and pyxis switches.

    Mounted: the current directory at the container workdir (as a runner mounts its
    workspace), the host's Hugging Face hub cache when it exists (HF_HUB_CACHE then points at
    it inside), the launch spec's mounts and `inferbench_slurm_container_mounts`.
    """
    mounts = [f"{Path.cwd()}:{settings.container_workdir}"]
    env: dict[str, str] = {}
    hub = host_hf_hub(environ)
    if hub is not None:
        mounts.append(f"{hub}:{CONTAINER_HF_CACHE}")
        env["HF_HUB_CACHE"] = CONTAINER_HF_CACHE
    mounts += [pyxis_mount(m) for m in (*spec_mounts, *settings.container_mounts)]
    words = (f"--container-image={squash}", f"--container-mounts={','.join(mounts)}",
             "--container-writable", f"--container-workdir={settings.container_workdir}",
             "--container-remap-root", "--no-container-entrypoint")
    return words, env


@contextlib.contextmanager
def _locked(lock_path: Path, wait_s: float) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as lock:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ServerStartError(
                        f"another process has held {lock_path} for {wait_s:g}s "
                        "(an enroot import of the same image)") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_squash(image: str, squash_dir: Path, log_path: Path,
                  lock_wait_s: float = IMPORT_LOCK_WAIT_S) -> Path:
    """The image's squashfs file, imported now unless present. Import output goes to
    `log_path`; a failed import raises ServerStartError with its tail."""
    target = squash_path(squash_dir, image)
    if target.is_file():
        return target
    with _locked(target.with_name(target.name + ".lock"), lock_wait_s):
        if target.is_file():  # imported by whoever held the lock
            return target
        partial = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        partial.unlink(missing_ok=True)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = enroot_import_argv(image, partial)
        with log_path.open("w", encoding="utf-8") as log:
            try:
                done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log,
                                      stderr=subprocess.STDOUT, timeout=IMPORT_TIMEOUT_S,
                                      check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                partial.unlink(missing_ok=True)
                raise ServerStartError(f"enroot import of {image} failed: {exc}") from None
        if done.returncode != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
            raise ServerStartError(
                f"enroot import of {image} exited with code {done.returncode}; log {log_path}"
                f"\n--- last log lines ---\n{tail or '(empty)'}")
        partial.replace(target)
    return target
