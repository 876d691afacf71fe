"""Suite-wide settings that make the suite cheaper to run and change no test's meaning.

`pytester.runpytest` runs pytest in this process and, after each run, forgets every module the
run imported first. A plugin of the environment that imports its package lazily (hypothesis's
imports hypothesis in its terminal summary) then has that package compiled and
assertion-rewritten again by every in-process run: seconds each on a 2-core machine. Imported
once here, it stays loaded across runs.

Child processes (pytest runs, xdist workers, simulated servers) compile the project's sources,
and pytest rewrites its plugins' asserts, anew in each process where PYTHONDONTWRITEBYTECODE is
set. The children's bytecode goes to a cache of the suite's own in the user's cache directory
(PYTHONPYCACHEPREFIX), so one child compiles and the rest read; no __pycache__ is written
beside any source or test file. With a prefix Python reads bytecode only from there (not from
site-packages' __pycache__), so the cache is kept between runs: only the first run compiles
the libraries the children import. Python checks each entry against its source's size and
modification time, as it does in __pycache__. The entries of sources under the temporary
directory (pytester's files, which no later run imports) are dropped at the start of a run, so
the cache does not grow run after run.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

for _name in ("hypothesis",):
    if importlib.util.find_spec(_name) is not None:
        importlib.import_module(_name)

_DONT_WRITE = pytest.StashKey[str]()


def bytecode_cache() -> Path:
    """The children's bytecode cache: the user's own cache directory, never a shared one."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "pytest-inferbench" / "tests-pyc"


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or "PYTHONPYCACHEPREFIX" in os.environ:
        return  # bytecode is cached already, or the environment chose where
    cache = bytecode_cache()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return  # no writable cache directory: children compile, as before
    # Where the bytecode of files under the temporary directory lands (the prefix mirrors
    # each source's absolute path); a run still using it at the same time only recompiles.
    temporary = Path(tempfile.gettempdir()).resolve()
    shutil.rmtree(cache.joinpath(*temporary.parts[1:]), ignore_errors=True)
    config.stash[_DONT_WRITE] = os.environ.pop("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONPYCACHEPREFIX"] = str(cache)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _DONT_WRITE in config.stash:
        os.environ.pop("PYTHONPYCACHEPREFIX", None)
        os.environ["PYTHONDONTWRITEBYTECODE"] = config.stash[_DONT_WRITE]
