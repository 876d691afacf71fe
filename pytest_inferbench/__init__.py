"""pytest-inferbench: LLM inference benchmarks as pytest tests.

The public face: what benchmarks written in Python annotate their fixtures with. The names load
on first use, so that pytest importing the plugin entry (`pytest_inferbench.plugin`) does not
pull the fixture machinery in through the package.

PYTEST_DONT_REWRITE: this package module holds no assertion. Without the marker, every pytest
session started in a process that already imported the plugin (pytester's in-process runs, with
the console-script `pytest` and an editable install) warns that the package cannot be rewritten.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .evals.runner import EvalResult
    from .plugin.fixtures import PointResult, RunInfo, Server

__all__ = ["EvalResult", "PointResult", "RunInfo", "Server", "__version__"]

__version__ = metadata.version("pytest-inferbench")


def __getattr__(name: str) -> object:
    if name in ("PointResult", "RunInfo", "Server"):
        from .plugin import fixtures

        return getattr(fixtures, name)
    if name == "EvalResult":
        from .evals import runner

        return runner.EvalResult
    raise AttributeError(f"module 'pytest_inferbench' has no attribute {name!r}")
