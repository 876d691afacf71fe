"""Baselines: results of an earlier run, matched to the current points by identity.

A baseline is a `summary.json` written by this plugin (`{"points": [result, ...]}`), a plain
JSON list of results, a single result JSON (a point's raw file gives back its full record),
or a directory holding any of these (searched recursively, e.g. a whole results directory).
A point is identified by its recipe identity, never by image, so a new image is compared
against the old one; a baseline measured with another backend, time scale, client settings or
agentic replay (duration, lane starts, warmup, so the fast mode too; `setup_of`) is refused
unless `--inferbench-baseline-any-setup` asks for the comparison.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..options.replay import is_fast_mode
from ..results import catalog, metric_kinds
from ..results.build import write_json_atomic
from ..results.point_files import NAMESPACE, point_record

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from ..results.record import JSONValue, Record

# Fields that say which point a result belongs to (the first name present in each group wins).
IDENTITY_FIELDS: tuple[tuple[str, ...], ...] = (
    ("config_key",),
    ("infmax_model_prefix", "model_prefix"),
    ("hw", "runner"),
    ("hardware",),
    ("framework",),
    ("precision",),
    ("tp",),
    ("ep",),
    ("dp_attention", "dp_attn"),
    ("spec_decoding",),
    ("isl",),
    ("osl",),
    ("conc", "max_concurrency"),
    ("kv_offloading",),  # an agentic row's KV tier: rows alike but for it are other points
)

# What a measurement was taken with: results differ across these for reasons other than the
# server, so a baseline taken otherwise is refused unless --inferbench-baseline-any-setup.
SETUP_FIELDS = ("backend", "time_scale")
CLIENT_FIELDS = ("dataset", "seed", "random_range_ratio", "prompts_per_conc", "warmup",
                 "request_rate", "chat_template")
# An agentic replay's (`workload.kind` agentic-replay): how long it ran and how each lane
# started. InferenceX's fast mode is one such setting, 1200 s after one warmup request per lane.
REPLAY_FIELDS = ("duration_s", "trajectory_start", "warmup_requests_per_lane")


def setup_of(result: Record) -> dict[str, JSONValue]:
    """Backend, time scale, client and agentic replay settings of a result (the keys it
    records)."""
    setup = {key: result[key] for key in SETUP_FIELDS if key in result}
    workload = result.get("workload")
    if isinstance(workload, dict):
        setup.update({f"client {key}": workload[key] for key in CLIENT_FIELDS if key in workload})
        if workload.get("kind") == "agentic-replay":
            if all(key in workload for key in ("duration_s", "warmup_requests_per_lane")):
                fast = is_fast_mode(workload["duration_s"], workload["warmup_requests_per_lane"])
                setup["replay mode"] = "fast" if fast else "standard"
            setup.update({f"replay {key}": workload[key] for key in REPLAY_FIELDS
                          if key in workload})
    return setup


def setup_differences(now: Record, then: Record) -> list[str]:
    """`key: then -> now` for every setup key both results record and that differs."""
    before, after = setup_of(then), setup_of(now)
    return [f"{key} {before[key]!r} -> {after[key]!r}" for key in after
            if key in before and before[key] != after[key]]


class BaselineError(Exception):
    """The baseline cannot be read; the message names the file."""


def higher_is_better(metric: str) -> bool:
    """Direction of a metric, as the metric catalog declares it: throughput up, latency down."""
    direction = catalog.direction(metric)
    if direction is not None:
        return direction is metric_kinds.Direction.HIGHER
    raise BaselineError(
        f"no known direction for metric {metric!r}: the metric catalog says neither higher "
        "nor lower is better for it"
    )


def identity(result: Record) -> tuple[tuple[str, str], ...]:
    key: list[tuple[str, str]] = []
    for names in IDENTITY_FIELDS:
        for name in names:
            if result.get(name) is not None:
                key.append((names[0], str(result[name]).lower()))
                break
    return tuple(key)


@dataclass(frozen=True)
class Baseline:
    source: Path
    points: tuple[tuple[tuple[tuple[str, str], ...], Record], ...]

    def find(self, result: Record) -> Record | None:
        return dict(self.points).get(identity(result))


def _results_in(data: object) -> list[Record]:
    if isinstance(data, dict) and isinstance(data.get("points"), list):
        return [p for p in data["points"] if isinstance(p, dict)]
    if isinstance(data, list):
        return [p for p in data if isinstance(p, dict)]
    if isinstance(data, dict) and isinstance(data.get(NAMESPACE), dict) and (
            "max_concurrency" in data):
        return [point_record(data)]  # a point's raw file
    if isinstance(data, dict) and ("conc" in data or "max_concurrency" in data):
        return [data]
    return []


def load_baseline(path: Path) -> Baseline:
    files = sorted(path.rglob("*.json")) if path.is_dir() else [path]
    if not path.exists():
        raise BaselineError(f"baseline {path} does not exist")
    points: dict[tuple[tuple[str, str], ...], Record] = {}
    problems: list[str] = []
    for file in files:
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            why = "nested too deeply" if isinstance(exc, RecursionError) else exc
            problems.append(f"baseline {file}: not readable JSON: {why}")
            continue
        for result in _results_in(data):
            problems += _metric_problems(file, result)
            points[identity(result)] = result
    runs = sorted({str(r["run_id"]) for r in points.values() if r.get("run_id")})
    if len(runs) > 1:
        problems.append(f"baseline {path} mixes the results of {len(runs)} runs "
                        f"({', '.join(runs[:4])}{', ...' if len(runs) > 4 else ''}): give one "
                        "run's summary.json or results directory")
    if problems:
        raise BaselineError("\n".join(problems))
    if not points and not problems:
        raise BaselineError(f"baseline {path} holds no point results")
    return Baseline(path, tuple(points.items()))


def _metric_problems(file: Path, result: Record) -> list[str]:
    """A compared metric that is text, a list, NaN or infinite would skip its check silently;
    null is what the writer records for a metric a point has none of (no AL, no interactivity
    at TPOT 0)."""
    problems = []
    for metric, _ in catalog.baseline_metrics():
        value = result.get(metric)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
                value):
            where = result.get("result_filename") or result.get("config_key") or "a point"
            problems.append(f"baseline {file}: {where}: {metric} = {value!r} (expected a "
                            "finite number or null)")
    return problems


def save_baseline(
    path: Path, results: Iterable[Mapping[str, object]], metadata: Mapping[str, object]
) -> None:
    """The run's results as a baseline at `path`; `build.WriteError` names it when it cannot
    be written."""
    write_json_atomic(path, {"metadata": dict(metadata), "points": [dict(r) for r in results]})
