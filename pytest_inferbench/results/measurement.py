"""What one point measured, as a backend hands it over: the request records plus what the server
itself reported. `build.build_result` turns it into the point's result record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .agentic import ReplayMeta
    from .metrics import RequestRecord
    from .power import PowerReading
    from .record import JSONValue

# What a simulated result says of itself, in one wording wherever it appears: the note of every
# point the simulator returns, and the title of every table of simulated points.
SIMULATED_NOTE = "SIMULATED: numbers predicted by the performance model, not measured on hardware"
# The `source` of a point's server metrics that the simulator's engine counted in process
# (`sim/driver.server_metrics`), not a scrape of a server's /metrics.
ENGINE_COUNTERS = "simulator"


@dataclass(frozen=True)
class PointMeasurement:
    """The raw outcome of one point: the records plus what the server itself reported."""

    records: Sequence[RequestRecord]
    duration_s: float
    num_prompts: int
    max_concurrency: int
    simulated: bool
    # What the server said of the point: deltas, AL, KV, preemptions.
    server_metrics: Mapping[str, JSONValue] = field(default_factory=dict)
    client_check: Mapping[str, JSONValue] = field(default_factory=dict)  # self-check verdict
    notes: tuple[str, ...] = ()
    # Wall-clock start of the measured phase (a simulated point: when it was simulated; its
    # virtual timeline is anchored there).
    started_unix: float | None = None
    # `Workload.describe()` and more
    workload: Mapping[str, JSONValue] = field(default_factory=dict)
    # The simulated server's clock as it announced it (0: as fast as it can, timings are not
    # meaningful); None for real servers and the in-process simulator's virtual clock.
    time_scale: float | None = None
    # A simulated point: the simulator's expected error in the point's regime, and the line
    # that shows it (`sim.expected_error`); empty for measured points.
    expected_error: Mapping[str, JSONValue] = field(default_factory=dict)
    expected_error_label: str | None = None
    # Each GPU's mean power over the measured phase (`results.power`): the simulator's model,
    # a GPU tool's samples, or why there is none; None where the backend says nothing of it.
    power: PowerReading | None = None
    # An agentic replay's point: what its aggregate needs besides the records (`agentic`).
    replay: ReplayMeta | None = None
