"""Suite-wide settings that make the suite cheaper to run and change no test's meaning.

`pytester.runpytest` runs pytest in this process and, after each run, forgets every module the
run imported first. A plugin of the environment that imports its package lazily (hypothesis's
imports hypothesis in its terminal summary) then has that package compiled and
assertion-rewritten again by every in-process run: seconds each on a 2-core machine. Imported
once here, it stays loaded across runs.

Child processes (pytest runs, xdist workers, simulated servers) compile the project's sources,
and pytest rewrites its plugins' asserts, anew in each process where PYTHONDONTWRITEBYTECODE is
set. For the children of this run the bytecode goes to one cache of the run's own
(PYTHONPYCACHEPREFIX), so the first child compiles and the rest read; no __pycache__ is
written beside any source or test file, and the cache is removed at the end.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import tempfile

import pytest

for _name in ("hypothesis",):
    if importlib.util.find_spec(_name) is not None:
        importlib.import_module(_name)

_BYTECODE_CACHE = pytest.StashKey[tuple[str, str]]()


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or "PYTHONPYCACHEPREFIX" in os.environ:
        return  # bytecode is cached already, or the environment chose where
    cache = tempfile.mkdtemp(prefix="inferbench-tests-pyc-")
    config.stash[_BYTECODE_CACHE] = (cache, os.environ.pop("PYTHONDONTWRITEBYTECODE"))
    os.environ["PYTHONPYCACHEPREFIX"] = cache


def pytest_unconfigure(config: pytest.Config) -> None:
    if _BYTECODE_CACHE not in config.stash:
        return
    cache, dont_write = config.stash[_BYTECODE_CACHE]
    os.environ.pop("PYTHONPYCACHEPREFIX", None)
    os.environ["PYTHONDONTWRITEBYTECODE"] = dont_write
    shutil.rmtree(cache, ignore_errors=True)
