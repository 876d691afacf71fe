"""The fixture types under the name benchmarks written before the public face imported them by.

New code imports them from the top: `from pytest_inferbench import PointResult, Server`.
"""

from __future__ import annotations

from .evals.runner import EvalResult
from .plugin.fixtures import PointResult, RunInfo, Server

__all__ = ["EvalResult", "PointResult", "RunInfo", "Server"]
