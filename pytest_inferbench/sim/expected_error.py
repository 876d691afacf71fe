"""How far off a simulated point is expected to be: its regime and the simulator's error there.

The figures are not chosen here: `expected_error.json` beside this module holds the median
|error| per regime and metric over the published measurements of docs/simulator.md (its
reference table and calibration table), as `python benchmarks/sim_reference.py --write` computes
them. A regime has a figure for a metric only where at least `MIN_POINTS` reference points fall
in it; elsewhere the error is unknown and a point says so.

A regime is the point's family (are its hardware, framework and model architecture the ones the
constants were fitted on, without speculative decoding; or a multinode deployment, which no
reference point ran) and its batch (`batch_regime`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from . import calibration, catalog

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..results.record import JSONValue
    from .config import EngineConfig

DATA_FILE = "expected_error.json"
METRICS = ("ttft", "tpot", "throughput")
# What each metric of the reference rows counts as (metrics.summarize keys): the mean ITL is the
# decode time per token as the lambda.ai pages report it, the same quantity TPOT measures.
METRIC_OF_KEY = {"mean_ttft_ms": "ttft", "mean_tpot_ms": "tpot", "mean_itl_ms": "tpot",
                 "output_throughput": "throughput"}
MIN_POINTS = 2  # one point is an anecdote, not a spread
SMALL_BATCH_CONC = 8  # at most this many requests in flight: decode-bound small batches
PREFILL_HEAVY_RATIO = 4  # input at least this many times the output: prefill weighs
CALIBRATED = "calibrated family"
UNCALIBRATED = "uncalibrated family"
MULTINODE = "multinode"
FAMILIES = (CALIBRATED, UNCALIBRATED, MULTINODE)
BATCHES = ("small batch", "prefill-heavy", "high concurrency")


def batch_regime(isl: int, osl: int, conc: int) -> str:
    if conc <= SMALL_BATCH_CONC:
        return "small batch"
    if isl >= PREFILL_HEAVY_RATIO * osl:
        return "prefill-heavy"
    return "high concurrency"


@cache
def _calibrated_key() -> tuple[str, str, str]:
    arch = catalog.checkpoint(calibration.MODEL).architecture.name
    return catalog.hardware(calibration.HARDWARE).name, calibration.FRAMEWORK, arch


def family(config: EngineConfig, *, multinode: bool = False) -> str:
    """Calibrated: the chip, the framework and the model architecture of the calibration set,
    which ran no speculative decoding."""
    if multinode:
        return MULTINODE
    arch = catalog.checkpoint(config.model).architecture.name
    same = (config.hardware, config.framework, arch) == _calibrated_key()
    return CALIBRATED if same and config.spec is None else UNCALIBRATED


def regime(config: EngineConfig, isl: int, osl: int, conc: int, *,
           multinode: bool = False) -> str:
    return f"{family(config, multinode=multinode)}, {batch_regime(isl, osl, conc)}"


def regime_names() -> tuple[str, ...]:
    return tuple(f"{f}, {b}" for f in FAMILIES for b in BATCHES)


@dataclass(frozen=True)
class Figure:
    """The median |error| of one metric in one regime (None: too few points) and its points."""

    error: float | None
    points: int


def figures(abs_errors: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, Figure]]:
    """{regime: {metric: Figure}} for every regime from its reference points' |errors|."""
    out: dict[str, dict[str, Figure]] = {}
    for name in regime_names():
        per_metric = abs_errors.get(name, {})
        out[name] = {}
        for metric in METRICS:
            values = sorted(per_metric.get(metric, []))
            n = len(values)
            median = (None if n < MIN_POINTS
                      else (values[(n - 1) // 2] + values[n // 2]) / 2)
            out[name][metric] = Figure(None if median is None else round(median, 3), n)
    return out


def table_json(table: dict[str, dict[str, Figure]], source: str) -> dict[str, object]:
    """The data file's content."""
    return {"source": source, "min_points": MIN_POINTS,
            "regimes": {name: {m: {"median_abs_error": f.error, "points": f.points}
                               for m, f in metrics.items()} for name, metrics in table.items()}}


@cache
def _packaged() -> dict[str, object]:
    text = resources.files(__package__).joinpath(DATA_FILE).read_text(encoding="utf-8")
    data: dict[str, object] = json.loads(text)
    return data


def packaged_json() -> dict[str, object]:
    return dict(_packaged())


def expected_error(regime_name: str) -> dict[str, JSONValue]:
    """The record's `expected_error`: the regime, its figure per metric (a fraction; None:
    unknown), the reference points behind each, the source, and the line that shows it."""
    data = _packaged()
    regimes = data["regimes"]
    assert isinstance(regimes, dict)
    entry = regimes[regime_name]
    out: dict[str, JSONValue] = {"regime": regime_name}
    points: dict[str, JSONValue] = {}
    for metric in METRICS:
        out[metric] = entry[metric]["median_abs_error"]
        points[metric] = entry[metric]["points"]
    total = sum(int(str(n)) for n in points.values())
    out["points"] = points
    out["source"] = f"{data['source']}, {total} points"
    return out


def label(expected: Mapping[str, JSONValue]) -> str:
    """`SIMULATED ±12% TTFT, ±4% TPOT, ±5% throughput (calibrated family, small batch)`."""
    known = [f"±{value:.0%} {name}" for metric, name in
             zip(METRICS, ("TTFT", "TPOT", "throughput"), strict=True)
             if isinstance(value := expected.get(metric), float)]
    unknown = [name for metric, name in zip(METRICS, ("TTFT", "TPOT", "throughput"), strict=True)
               if not isinstance(expected.get(metric), float)]
    where = f"({expected['regime']})"
    if not known:
        return f"SIMULATED, no reference points: error unknown {where}"
    tail = f"; {', '.join(unknown)} error unknown" if unknown else ""
    return f"SIMULATED {', '.join(known)}{tail} {where}"
