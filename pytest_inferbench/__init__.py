"""pytest-inferbench: LLM inference benchmarks as pytest tests.

PYTEST_DONT_REWRITE: this package module holds no assertion. Without the marker, every pytest
session started in a process that already imported the plugin (pytester's in-process runs, with
the console-script `pytest` and an editable install) warns that the package cannot be rewritten.
"""

from __future__ import annotations

__version__ = "0.1.0"
