"""Server backends: how a server node is served (simulated, containerized, local, external).

`registry.BACKENDS` names them; `get_backend` imports the selected one's class.
"""

from __future__ import annotations

import importlib

from .base import Backend
from .registry import BACKENDS, BackendInfo, backend_info

__all__ = ["BACKENDS", "BackendInfo", "backend_info", "get_backend"]


def get_backend(name: str) -> Backend:
    """A new instance of the backend called `name` (its module is imported now)."""
    info = backend_info(name)
    cls = getattr(importlib.import_module(f"{__name__}.{info.module}"), info.class_name)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"backends.{info.module}.{info.class_name} is not a Backend")
    return cls()
