"""A copy of InferenceX's own repository (`../shared/inferencex/`) to run the plugin inside."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

# Imported before any in-process pytester run: pytester forgets the modules a run imported
# first, and numpy's C extension cannot be imported a second time in one process.
import numpy  # noqa: F401
import pytest

REPO = Path(__file__).resolve().parents[2]


def inferencex_source() -> Path:
    """The reference checkout: `INFERBENCH_INFERENCEX_DIR`, else `../shared/inferencex`."""
    return Path(os.environ.get("INFERBENCH_INFERENCEX_DIR")
                or REPO.parent / "shared" / "inferencex")


def inferencex_current_source() -> Path:
    """InferenceX's current layout (`configs/`, `benchmarks/` of 2026-08):
    `INFERBENCH_INFERENCEX_CURRENT_DIR`, else `../shared/inferencex-0801`."""
    return Path(os.environ.get("INFERBENCH_INFERENCEX_CURRENT_DIR")
                or REPO.parent / "shared" / "inferencex-0801")


@pytest.fixture(scope="session")
def inferencex_current_dir() -> Path:
    source = inferencex_current_source()
    if not (source / "configs" / "amd-master.yaml").is_file():
        pytest.skip(f"no InferenceX checkout of the current layout at {source} "
                    "(set INFERBENCH_INFERENCEX_CURRENT_DIR)")
    return source


@pytest.fixture(scope="session")
def inferencex_dir() -> Path:
    source = inferencex_source()
    if not (source / ".github" / "configs" / "amd-master.yaml").is_file():
        pytest.skip(f"no InferenceX checkout at {source} (set INFERBENCH_INFERENCEX_DIR)")
    return source


def copy_checkout(source: Path, target: Path) -> Path:
    """A writable copy (the reference tree is read-only)."""
    shutil.copytree(source, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return target


@pytest.fixture
def inferencex_copy(inferencex_dir: Path, tmp_path: Path) -> Path:
    return copy_checkout(inferencex_dir, tmp_path / "InferenceX")
