"""Server backends: how a server node is served (simulated, containerized, local, external)."""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Backend

# Backend name -> module under pytest_inferbench.backends. Imported only when selected, so the
# default simulator never imports the docker SDK and a docker run never imports the simulator.
BACKEND_MODULES = {
    "sim": "sim",
    "sim-server": "simserver",
    "docker": "docker",
    "process": "process",
    "external": "external",
}


def get_backend(name: str) -> Backend:
    """The backend called `name` (the `Backend.name` of a class in its module)."""
    from .base import Backend

    module_name = BACKEND_MODULES.get(name)
    if module_name is None:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKEND_MODULES)}")
    module = importlib.import_module(f"{__name__}.{module_name}")
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if (issubclass(cls, Backend) and not inspect.isabstract(cls)
                and getattr(cls, "name", None) == name):
            return cls()
    raise ValueError(f"backend module {module.__name__} defines no backend named {name!r}")
