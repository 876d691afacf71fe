"""The simulated server's GPU energy on `/metrics`, labelled `simulated="true"`: the joules each
GPU has drawn since the server started, by the in-process backend's power model (`sim/power.py`)
over the steps the engine ran and the idle time between them, and the seconds of the model's
clock they cover. A client takes both counters' differences over a point's measured phase:
their ratio is each GPU's mean power (`backends/measured.py`).

Only a single-node engine on a GPU with power figures exports them, as only such a point of the
in-process backend has power figures.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily

from ..catalog import CatalogError
from ..engine import Engine
from ..power import ENERGY_COUNTER, SECONDS_COUNTER, GpuPower, energy_j, gpu_power, step_work

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from prometheus_client.core import Metric

    from .engine_loop import EngineLike, EngineLoop


class EnergyCollector:
    """prometheus_client custom collector: both counters, read at every scrape."""

    def __init__(self, engine: Engine, figures: GpuPower, model: str,
                 loop: Callable[[], EngineLoop | None]) -> None:
        self._engine = engine
        self._figures = figures
        self._model = model
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        loop = self._loop()
        busy, seconds = (loop.busy_s, loop.model_seconds()) if loop is not None else (0.0, 0.0)
        work = step_work(self._engine.cost, busy, dataclasses.asdict(self._engine.counters()))
        labels = ["model_name", "simulated"]
        energy = CounterMetricFamily(
            ENERGY_COUNTER, "Joules each GPU drew by the simulator's power model "
            "(simulated, not measured)", labels=labels)
        energy.add_metric([self._model, "true"], energy_j(self._figures, work, seconds))
        clock = CounterMetricFamily(
            SECONDS_COUNTER, "Seconds of the simulator's model clock the energy covers",
            labels=labels)
        clock.add_metric([self._model, "true"], seconds)
        yield energy
        yield clock


def energy_collector(engine: EngineLike, model: str, loop: Callable[[], EngineLoop | None]
                     ) -> EnergyCollector | None:
    """The collector for a single-node engine on a GPU with power figures; None otherwise (a
    deployment's pools, a GPU the power catalog lacks: no figure made up)."""
    if not isinstance(engine, Engine):
        return None
    try:
        figures = gpu_power(engine.config.hardware)
    except CatalogError:
        return None
    return EnergyCollector(engine, figures, model, loop)
