"""What a metric catalog entry is: a `Metric` (or a `Fact`) and how it is shown (`Column`,
`PlotAxis`), which way is better (`Direction`), and the statistic names of a distribution's
record keys. The entries themselves are `catalog.CATALOG`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from .request_records import Flat

FloatArray = npt.NDArray[np.float64]

DEFAULT_PERCENTILES = (90.0, 99.0, 99.9)  # vLLM benchmark_serving's --metric-percentiles
MS_SUFFIX = "_ms"
InferenceX = Literal["", "raw", "agg"]


class Direction(Enum):
    HIGHER = "higher is better"
    LOWER = "lower is better"


@dataclass(frozen=True)
class Column:
    """A terminal/markdown table column showing one key of a metric."""

    header: str
    key: str
    scale: float = 1.0  # e.g. 1000 to show seconds in ms
    digits: int = 1
    beside: str = ""  # another record key shown in parentheses after the value
    optional: bool = False  # shown only in a table where a point has the key


@dataclass(frozen=True)
class PlotAxis:
    """A key drawn on the plots: the throughput per GPU on y, each x its own panel."""

    key: str
    label: str
    axis: str  # "x" or "y"; "agentic-x", "agentic-y": the agentic points' Pareto plot


@dataclass(frozen=True)
class Fact:
    """A JUnit property that measures nothing: the point's identity and setup. Declared here
    only so that the properties keep one order with the metrics between them."""

    name: str


@dataclass(frozen=True)
class Metric:
    """One metric. `percentiles` makes it a distribution of per-request samples (seconds);
    `derived_from` names the distribution whose ms statistics `derive` turns into this one's."""

    name: str
    title: str  # what it is and how it is counted
    unit: str  # of the value as recorded (a distribution: of its seconds keys); "" for counts
    direction: Direction | None = None  # None: no baseline can judge it
    timing: bool = False  # a clock measured it: not judged at time scale 0
    # A distribution's samples in seconds, from the point's successful requests. None for the
    # chunk-gap distributions (ITL, per-token ITL), which `metrics.summarize` counts per step
    # or per chunk in one pass.
    samples: Callable[[Flat], FloatArray] | None = None
    percentiles: tuple[float, ...] = ()
    derived_from: str = ""
    derive: Callable[[float], float | None] | None = None  # from one ms statistic
    # Where InferenceX has it: "raw", benchmark_serving writes it (a distribution: its ms
    # statistics; process_result.py adds them in seconds); "agg", process_result.py derives it.
    inferencex: InferenceX = ""
    junit: tuple[str, ...] = ()  # its keys that are JUnit properties, in their order
    columns: tuple[Column, ...] = ()
    plot: tuple[PlotAxis, ...] = ()
    # Its keys compared with a baseline by default: InferenceX's compare_results.METRIC_DEFS,
    # plus the output throughput per GPU and the AL.
    baseline: tuple[str, ...] = ()
    goodput: bool = False  # an SLO of --inferbench-goodput (a distribution, limit in ms)

    @property
    def distribution(self) -> bool:
        return bool(self.percentiles)

    def __post_init__(self) -> None:
        if bool(self.derived_from) != (self.derive is not None):
            raise ValueError(f"metric {self.name}: derived_from and derive go together")

    def record_keys(self, source_percentiles: tuple[float, ...] = ()) -> tuple[str, ...]:
        """Its record keys; a derived metric's follow its source's percentiles."""
        if self.distribution:
            stats = stat_names(self.percentiles)
            return (*(f"{s}_{self.name}{MS_SUFFIX}" for s in stats),
                    *(f"{s}_{self.name}" for s in stats))
        if self.derived_from:
            return tuple(f"{s}_{self.name}" for s in stat_names(source_percentiles))
        return (self.name,)


def percentile_label(p: float) -> str:
    """vLLM's key label: `99` for integral percentiles, `99.9` otherwise."""
    return str(int(p)) if float(p).is_integer() else str(p)


def stat_names(percentiles: Sequence[float]) -> tuple[str, ...]:
    """vLLM's statistics of a distribution, in its key order."""
    return ("mean", "median", "std", *(f"p{percentile_label(p)}" for p in percentiles))
