"""A local Docker image of the simulator: the docker backend with no registry and no GPU
(`--inferbench-docker-sim`, and the tests of the docker backend).

The image is a tiny root file system (directories, /etc/passwd, and the same top-level
symlinks as the host: `bin -> usr/bin`, ...; /sbin stays a directory for docker-init),
imported with the docker SDK. It contains no Python: the host's Python installation, its
site-packages and the project directory are bind-mounted read-only at their host paths
through `INFERBENCH_DOCKER_MOUNTS`, which the docker backend adds to every container.
The container then runs exactly what a launch spec says, e.g.
`python3 -m pytest_inferbench.sim serve --hardware MI355X -- <server argv>`, with host
networking on 127.0.0.1, like the real ATOM image would run its server.

    from pytest_inferbench.backends import simimage
    client = docker.from_env()
    image = simimage.ensure_image(client)              # "inferbench-sim:local"
    os.environ[MOUNTS_ENV] = simimage.mounts_value()   # before the docker backend starts

Building takes well under a second (the tarball is a few kilobytes); an existing image with
the same tag and contents is reused.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import sysconfig
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from docker import DockerClient

IMAGE = "inferbench-sim:local"
DIGEST_LABEL = "inferbench.simimage"
TOP_LEVEL_LINKS = ("bin", "lib", "lib32", "lib64", "libx32")
# /sbin is a real directory (not a link into the read-only /usr mount) because docker puts
# its init binary (`init=True`) at /sbin/docker-init.
EMPTY_DIRS = ("etc", "root", "tmp", "proc", "sys", "dev", "usr", "sbin", "var/tmp", "run")


def project_root() -> Path:
    """The directory holding the `pytest_inferbench` package (an editable install's source)."""
    return Path(__file__).resolve().parents[2]


def host_mounts() -> list[str]:
    """Host paths the container needs, deduplicated so none is inside another."""
    paths = {Path("/usr"), Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(),
             Path(sysconfig.get_paths()["purelib"]).resolve(),
             Path(sysconfig.get_paths()["platlib"]).resolve(), project_root()}
    for name in TOP_LEVEL_LINKS:
        top = Path("/") / name
        if top.is_dir() and not top.is_symlink():
            paths.add(top)  # not merged-/usr: the real directory has to come in too
    ordered = sorted(paths, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in ordered:
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return [str(p) for p in kept]


def mounts_value() -> str:
    """The value for INFERBENCH_DOCKER_MOUNTS: every host path read-only at the same path."""
    return ",".join(f"{p}:{p}:ro" for p in host_mounts())


def container_env() -> dict[str, str]:
    """What a container needs to import this very package: an editable install's finder may
    point at another checkout than the one running (a worktree on PYTHONPATH), so the
    container is told where this one is (mounted by `mounts_value`)."""
    return {"PYTHONPATH": str(project_root())}


def rootfs_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in EMPTY_DIRS:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if name.endswith("tmp") else 0o755
            tar.addfile(info)
        for name in TOP_LEVEL_LINKS:
            top = Path("/") / name
            if top.is_symlink():
                info = tarfile.TarInfo(name)
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(top)
                tar.addfile(info)
        passwd = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(passwd))
    return buffer.getvalue()


def image_changes() -> list[str]:
    bin_dir = Path(sys.executable).parent
    return [
        f"ENV PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "ENV PYTHONDONTWRITEBYTECODE=1",  # the mounts are read-only
        "ENV HOME=/root",
        "WORKDIR /tmp",
    ]


def ensure_image(client: DockerClient, tag: str = IMAGE, rebuild: bool = False) -> str:
    """Import the image unless an identical one exists; returns its tag.

    The image records a digest of its contents (root tarball and settings such as PATH) in
    the `inferbench.simimage` label, so a tag built by another Python environment is rebuilt
    instead of reused with a stale PATH.
    """
    import docker.errors

    tar, changes = rootfs_tar(), image_changes()
    digest = hashlib.sha256(tar + "\n".join(changes).encode()).hexdigest()[:16]
    if not rebuild:
        try:
            if client.images.get(tag).labels.get(DIGEST_LABEL) == digest:
                return tag
        except docker.errors.ImageNotFound:
            pass
    repository, _, version = tag.partition(":")
    client.api.import_image_from_data(tar, repository=repository, tag=version or "latest",
                                      changes=[*changes, f"LABEL {DIGEST_LABEL}={digest}"])
    return tag
