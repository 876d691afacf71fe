"""Per-point pass/fail rules. Each failure is one line that says what, how much, and where from.

Entry points for the collection code:

- `load_gates(recipe_path, settings) -> Gates` (cached per recipe directory): the SLO file
  (`--inferbench-gates` or `gates.yaml` next to the recipe), the golden ALs (the packaged table,
  plus a `golden_al/` directory next to the recipe); raises `GatesFileError` / `GoldenALError`
  with file:line.
- `load_baseline_for(settings) -> Baseline | None` (once per session).
- `acceptance_fields(point, spec, gates) -> dict`: spec-decode method, k, thinking mode, forced
  and golden AL of a point.
- `evaluate_point(result, point, spec, settings, gates, baseline) -> list[str]`: the failures;
  the result is only read.
- `point_fields(point, spec, settings) -> dict`: the `acceptance_fields` recorded with a point
  before its gates run (empty when the gates files cannot be read).
- `check_point(result, point, spec, settings) -> PointFindings`: the runner's entry: loads the
  gates and the baseline, returns the failures and the `acceptance_fields` to record with the
  result (the measured AL next to the golden AL). Unreadable gates, golden-AL or baseline
  files come back as failure lines naming the file and line, never as tracebacks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..recipe.golden import GoldenAL, GoldenALError, load_golden_al, packaged
from ..results import agentic, catalog
from ..results.catalog import is_timing, unit_of
from ..results.record import mapping as _mapping
from ..results.record import number as _number
from .baseline import (
    Baseline,
    BaselineError,
    higher_is_better,
    load_baseline,
    setup_differences,
)
from .rules import (
    GOLDEN_AL_DELTA,
    GatesFile,
    GatesFileError,
    display_path,
    known_metrics,
    load_gates_file,
)
from .speculative import speculative_decoding

if TYPE_CHECKING:
    from ..options import Settings
    from ..recipe.launch import ServerSpec
    from ..recipe.model import BenchPoint
    from ..results.record import JSONValue, Record

__all__ = [
    "Gates",
    "GatesFileError",
    "PointFindings",
    "acceptance_fields",
    "check_point",
    "evaluate_point",
    "known_metrics",
    "load_baseline_for",
    "load_gates",
]

SYNTHETIC_AL_TOLERANCE = 0.03


@dataclass(frozen=True)
class Gates:
    rules: GatesFile = field(default_factory=lambda: GatesFile(None))
    golden: GoldenAL = field(default_factory=packaged)


def _stamp(path: Path | None) -> tuple[int, int]:
    """Modification time and size: cache keys that notice an edited file."""
    try:
        stat = path.stat() if path else None
    except OSError:
        return (0, 0)
    return (stat.st_mtime_ns, stat.st_size) if stat else (0, 0)


@functools.lru_cache(maxsize=64)
def _gates_cached(
    gates_path: Path | None,
    gates_stamp: tuple[int, int],
    golden_dir: Path,
    golden_stamp: tuple[int, int],
) -> Gates:
    rules = load_gates_file(gates_path) if gates_path else GatesFile(None)
    return Gates(rules, packaged().merged(load_golden_al(golden_dir)))


def load_gates(recipe_path: Path, settings: Settings) -> Gates:
    directory = recipe_path.resolve().parent
    gates_path = settings.gates_file
    if gates_path is None and (directory / "gates.yaml").is_file():
        gates_path = directory / "gates.yaml"
    elif gates_path is not None and not gates_path.is_file():
        raise GatesFileError(f"{gates_path}: gates file does not exist (--inferbench-gates)")
    resolved = gates_path.resolve() if gates_path else None
    golden_dir = directory / "golden_al"
    return _gates_cached(resolved, _stamp(resolved), golden_dir, _stamp(golden_dir))


def load_baseline_for(settings: Settings) -> Baseline | None:
    if settings.baseline is None:
        return None
    path = settings.baseline.resolve()
    return _baseline_cached(path, _stamp(path))


@functools.lru_cache(maxsize=8)
def _baseline_cached(path: Path, stamp: tuple[int, int]) -> Baseline:
    return load_baseline(path)


def fmt(value: float, unit: str = "") -> str:
    magnitude = abs(value)
    text = (
        f"{value:.1f}"
        if magnitude >= 100
        else f"{value:.2f}"
        if magnitude >= 0.1
        else f"{value:.3g}"
    )
    return f"{text} {unit}" if unit else text


def acceptance_fields(point: BenchPoint, spec: ServerSpec | None,
                      gates: Gates) -> dict[str, JSONValue]:
    """Spec-decode identity and the golden AL for this point (empty when not speculative)."""
    sd = speculative_decoding(point.server, spec)
    if sd is None:
        return {}
    prefix = point.server.model_prefix
    return {
        "spec_method": sd.method,
        "spec_num_tokens": sd.num_tokens,
        "thinking_mode": sd.thinking_mode,
        "synthetic_acceptance_length": sd.forced_acceptance_length,
        "golden_acceptance_length": gates.golden.lookup(
            prefix, sd.method, sd.thinking_mode, sd.num_tokens
        ),
        "golden_al_source": gates.golden.source(prefix, sd.method),
    }


def point_fields(point: BenchPoint, spec: ServerSpec | None, settings: Settings) -> Record:
    """What is recorded with a point before any gate judges it: `acceptance_fields()`, so the
    files written before the gates already hold the golden AL; empty where the gates files
    cannot be read (`check_point` names why)."""
    try:
        return acceptance_fields(point, spec, load_gates(point.server.source, settings))
    except (GatesFileError, GoldenALError):
        return {}


@dataclass(frozen=True)
class PointFindings:
    """What the gates say of a point: its failures and the fields to record with its result."""

    failures: tuple[str, ...]
    fields: Record  # acceptance_fields(): the golden AL next to the measured one


def check_point(
    result: Record, point: BenchPoint, spec: ServerSpec | None, settings: Settings
) -> PointFindings:
    """The gates of the point's recipe directory and `--inferbench-baseline` (both cached),
    applied to a result; unreadable files come back as failures naming the file and line."""
    try:
        gates = load_gates(point.server.source, settings)
        baseline = load_baseline_for(settings)
    except (GatesFileError, GoldenALError, BaselineError) as exc:
        return PointFindings((str(exc),), {})  # bad input: the file:line reason, no traceback
    fields = acceptance_fields(point, spec, gates)
    failures = evaluate_point(result, point, spec, settings, gates, baseline)
    return PointFindings(tuple(failures), fields)


def evaluate_point(
    result: Record,
    point: BenchPoint,
    spec: ServerSpec | None,
    settings: Settings,
    gates: Gates,
    baseline: Baseline | None,
) -> list[str]:
    """Every gate the point fails, one line each (empty list: the point passes).

    The result is read, never changed; a speculative point is judged together with its
    `acceptance_fields()` (golden AL, method, k, thinking mode).
    """
    extra = {k: v for k, v in acceptance_fields(point, spec, gates).items() if k not in result}
    values = {**result, **extra}
    # An agentic point is judged as InferenceX's validator judges it (its profiling phase).
    validity = _mapping(_mapping(values.get("agentic")).get("validity"))
    failures = (agentic.inferencex_failures(validity) if "agentic" in values
                else _failure_ratio(values, settings.max_failure_ratio))
    failures += _speculative(values, point, spec)
    failures += _slo(values, point, gates.rules)
    if baseline is not None:
        failures += _regression(values, baseline, gates.rules, settings.baseline_any_setup)
    return failures


def _timings_refused(result: Record) -> str | None:
    """Why the result's timings cannot be judged, or None when they can."""
    if result.get("timings_meaningful", True):
        return None
    return (f"timings not meaningful (time scale {result.get('time_scale')}: the simulated "
            "server streamed as fast as it could)")


def _failure_ratio(result: Record, allowed: float) -> list[str]:
    total = _number(result.get("num_prompts"))
    completed = _number(result.get("completed"))
    failed = _number(result.get("failed"))
    if failed is None and total is not None and completed is not None:
        failed = total - completed
    if total is None or failed is None:
        return ["result has no request counts (num_prompts, completed/failed)"]
    if total <= 0:
        return ["no requests were sent (num_prompts = 0)"]
    ratio = failed / total
    if ratio > allowed:
        return [
            f"{failed:.0f}/{total:.0f} requests failed ({ratio:.1%} > allowed {allowed:.1%}, "
            f"--inferbench-max-failure-ratio){_top_causes(result.get('errors'))}"
        ]
    return []


TOP_CAUSES = 3
CAUSE_CHARS = 120


def _top_causes(errors: object) -> str:
    """': 4 x HTTP 500: ..., 2 x stream ended without [DONE]' from the result's error counts
    (most frequent first, as `metrics.group_errors` orders them)."""
    if not isinstance(errors, dict) or not errors:
        return ""
    items = [(str(k), v) for k, v in errors.items() if isinstance(v, int)]
    shown = [f"{count} x {reason[:CAUSE_CHARS]}" for reason, count in items[:TOP_CAUSES]]
    rest = sum(count for _, count in items[TOP_CAUSES:])
    if rest:
        shown.append(f"{rest} x other causes")
    return ": " + ", ".join(shown)


def _speculative(
    result: Record, point: BenchPoint, spec: ServerSpec | None
) -> list[str]:
    sd = speculative_decoding(point.server, spec)
    if sd is None:
        return []
    failures: list[str] = []
    where = _spec_place(spec) if spec else point.server.config_key
    if spec is not None and sd.needs_chat_template and not spec.client.chat_framed:
        failures.append(
            f"speculative decoding ({sd.method}) without the chat template: "
            f"{_chat_template_fix(spec)}; AL depends on chat framing"
        )
    measured = _number(result.get("acceptance_length"))
    forced = sd.forced_acceptance_length
    if forced is not None:
        if measured is None:
            failures.append(
                f"acceptance_length not measured, but {sd.forced_by} forces "
                f"{fmt(forced)} ({where})"
            )
        else:
            error = abs(measured - forced) / forced
            if error > SYNTHETIC_AL_TOLERANCE:
                failures.append(
                    f"acceptance_length {fmt(measured)} != forced {fmt(forced)} "
                    f"({sd.forced_by}, {where}): off by {error:.1%} > "
                    f"{SYNTHETIC_AL_TOLERANCE:.0%}"
                )
    return failures


def _spec_place(spec: ServerSpec) -> str:
    """Where a spec's words come from, for the user: their own file, or the packaged one by
    name with the local file that would override it (never a path inside the package)."""
    if spec.packaged:
        return f"packaged {spec.launch_file.name}, overridden by {display_path(spec.user_file)}"
    return display_path(spec.user_file)


def _chat_template_fix(spec: ServerSpec) -> str:
    """Where the user turns the chat template on: their own launch spec, never the file
    inside the installed package (a local one of the same name overrides it)."""
    fix = f"set client.use-chat-template: true in {display_path(spec.user_file)}"
    if spec.packaged:
        fix += f" (a local copy of the packaged {spec.launch_file.name}, which it overrides)"
    return fix


def _slo(result: Record, point: BenchPoint, rules: GatesFile) -> list[str]:
    names = (point.server.config_key, point.server.node_name)
    failures: list[str] = []
    for rule in rules.rules:
        if not rule.matches(names, point.isl, point.osl, point.conc):
            continue
        for req in rule.requirements:
            where = rules.location(req.line)
            refused = _timings_refused(result) if is_timing(req.metric) else None
            if refused:
                failures.append(f"{req.metric}: not judged: {refused} ({where})")
                continue
            value, missing = _metric(result, req.metric)
            if value is None:
                failures.append(f"{req.metric}: {missing} ({where})")
                continue
            if not req.holds(value):
                unit = unit_of(req.metric)
                reasons = result.get(REASONS.get(req.metric, ""))
                why = f": {'; '.join(map(str, reasons))}" if isinstance(reasons, list) else ""
                failures.append(
                    f"{req.metric} {fmt(value, unit)} {req.violated_op} "
                    f"{fmt(req.threshold, unit)} ({where}){why}"
                )
    return failures


# A metric whose failure is explained by another key of the result (the reasons it holds).
REASONS = {"submission_valid": "invalid_reasons"}


def _metric(result: Record, metric: str) -> tuple[float | None, str]:
    if metric == GOLDEN_AL_DELTA:
        measured = _number(result.get("acceptance_length"))
        golden = _number(result.get("golden_acceptance_length"))
        if measured is None:
            return None, "no measured acceptance_length for this point"
        if golden is None:
            return None, (
                f"no golden AL for {result.get('spec_method')} "
                f"k={result.get('spec_num_tokens')} {result.get('thinking_mode')}"
            )
        return abs(measured - golden), ""
    if metric not in result:
        return None, "not in the result"
    value = _number(result[metric])
    return value, "" if value is not None else f"not a number ({result[metric]!r})"


def _regression(result: Record, baseline: Baseline, rules: GatesFile,
                any_setup: bool) -> list[str]:
    before = baseline.find(result)
    if before is None:
        return []  # a new point has nothing to regress from
    source = display_path(baseline.source)
    differences = setup_differences(result, before)
    if differences and not any_setup:
        return [f"baseline not comparable: measured otherwise ({'; '.join(differences)}; "
                f"{source}); --inferbench-baseline-any-setup compares anyway"]
    refused = _timings_refused(result) or _timings_refused(before)
    policy = rules.regression
    metrics = dict(catalog.baseline_metrics())
    for metric, _ in policy.tolerances:
        metrics.setdefault(metric, higher_is_better(metric))
    failures: list[str] = []
    if refused:
        failures.append(f"baseline: timing metrics not compared: {refused} ({source})")
        metrics = {m: h for m, h in metrics.items() if not is_timing(m)}
    for metric, higher in metrics.items():
        now, then = _number(result.get(metric)), _number(before.get(metric))
        if now is None or then is None or then == 0:
            continue
        tolerance = policy.tolerance_for(metric)
        change = (now - then) / abs(then)
        worse = -change if higher else change
        if worse > tolerance:
            unit = unit_of(metric)
            op = "<" if higher else ">"
            failures.append(
                f"{metric} {fmt(now, unit)} {op} baseline {fmt(then, unit)} "
                f"({change:+.1%}, tolerance {tolerance:.0%}; {source})"
            )
    return failures
