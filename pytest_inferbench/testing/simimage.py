"""The simulator's local Docker image, where the tests of the docker backend have always found
it; it lives in `backends.simimage` since `--inferbench-docker-sim` builds it too."""

from __future__ import annotations

from ..backends.simimage import (
    IMAGE,
    ensure_image,
    host_mounts,
    mounts_value,
    project_root,
    rootfs_tar,
)

__all__ = ["IMAGE", "ensure_image", "host_mounts", "mounts_value", "project_root", "rootfs_tar"]
