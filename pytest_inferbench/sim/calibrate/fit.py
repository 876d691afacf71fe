"""The fit: the knobs (`knobs.KNOBS`) that make the simulator reproduce measured points, within
their bounds, and how well such a fit predicts points it did not see (leave-one-out).

Each measured point is simulated as it ran (its server argv, lengths, concurrency, prompts and
range ratio) by the same virtual-time driver the `sim` backend uses. The residual of a metric is
log(predicted / measured), so a 10% miss weighs the same on TTFT in ms and throughput in tok/s.
Levenberg-Marquardt in the knobs' logarithms (numpy only), with forward-difference derivatives;
each step is clipped to the bounds. A weak pull towards the profile's values (`PRIOR_WEIGHT`)
keeps a knob the points say nothing about (no prefill in the data: compute efficiency) where
the profile puts it instead of drifting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ...loadgen.workload import LoadSettings, build_workload
from ...results.metrics import summarize
from ...results.record import to_float
from .. import catalog
from ..driver import simulate_point
from ..efficiency import profile_efficiency
from .knobs import KNOBS, clamp, from_values, to_values
from .points import KEY_OF_METRIC

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy.typing as npt

    from ..efficiency import Efficiency
    from .points import MeasuredPoint

    FloatArray = npt.NDArray[np.float64]

PRIOR_WEIGHT = 0.05  # a knob e times off the profile costs as much as a 5% miss
STEP = 0.01  # forward-difference step in log units (1%)
MAX_ITERATIONS = 25
TOLERANCE = 1e-6  # relative drop of the cost below which the fit has converged


def predict(point: MeasuredPoint, efficiency: Efficiency | None) -> dict[str, float]:
    """The point's metrics as the simulator predicts them with these knobs (None: profile)."""
    config = replace(point.config, efficiency=efficiency)
    per_conc = max(point.prompts // point.conc, 1)
    load = LoadSettings(prompts_per_conc=per_conc, range_ratio=point.range_ratio)
    outcome = simulate_point(config, build_workload(point.isl, point.osl, point.conc, load))
    summary = summarize(outcome.records, duration_s=outcome.duration_s,
                        num_prompts=per_conc * point.conc, max_concurrency=point.conc,
                        num_gpus=config.tp)
    return {m: to_float(summary[KEY_OF_METRIC[m]]) for m, _ in point.values}


def errors(point: MeasuredPoint, predicted: dict[str, float]) -> dict[str, float]:
    """Signed relative error per metric: predicted / measured - 1."""
    return {m: predicted[m] / measured - 1.0 for m, measured in point.values}


def profile_of(point: MeasuredPoint) -> Efficiency:
    return profile_efficiency(catalog.hardware(point.config.hardware),
                              catalog.framework(point.config.framework),
                              catalog.checkpoint(point.config.model).architecture.layers)


def _vector(eff: Efficiency) -> FloatArray:
    values = to_values(eff)
    return np.log(np.array([values[k.name] for k in KNOBS], dtype=np.float64))


def _efficiency(theta: FloatArray) -> Efficiency:
    return from_values(clamp({k.name: math.exp(float(t)) for k, t in zip(KNOBS, theta,
                                                                           strict=True)}))


LOWER = np.log(np.array([k.lower for k in KNOBS], dtype=np.float64))
UPPER = np.log(np.array([k.upper for k in KNOBS], dtype=np.float64))


@dataclass(frozen=True)
class Fit:
    efficiency: Efficiency
    iterations: int
    cost: float


def fit(points: Sequence[MeasuredPoint], start: Efficiency) -> Fit:
    """The knobs that minimize the squared log errors of `points` (plus the pull to `start`)."""
    theta0 = np.clip(_vector(start), LOWER, UPPER)

    def residuals(theta: FloatArray) -> FloatArray:
        eff = _efficiency(theta)
        out: list[float] = []
        for point in points:
            predicted = predict(point, eff)
            out += [math.log(max(predicted[m], 1e-12) / measured) for m, measured in point.values]
        out += list(PRIOR_WEIGHT * (theta - theta0))
        return np.array(out, dtype=np.float64)

    theta = theta0.copy()
    r = residuals(theta)
    cost = float(r @ r)
    damping = 1e-2
    iterations = 0
    for iterations in range(1, MAX_ITERATIONS + 1):  # noqa: B007 - the count is reported
        jac = np.empty((len(r), len(theta)), dtype=np.float64)
        for j in range(len(theta)):
            shifted = theta.copy()
            # Step inwards at an upper bound so the derivative sees the model, not the clamp.
            shifted[j] += STEP if theta[j] + STEP <= UPPER[j] else -STEP
            jac[:, j] = (residuals(shifted) - r) / (shifted[j] - theta[j])
        jtj, jtr = jac.T @ jac, jac.T @ r
        improved = False
        while damping < 1e8:
            a = jtj + damping * np.diag(np.diag(jtj) + 1e-9)
            trial = np.clip(theta - np.linalg.solve(a, jtr), LOWER, UPPER)
            r_trial = residuals(trial)
            cost_trial = float(r_trial @ r_trial)
            if cost_trial < cost:
                drop = (cost - cost_trial) / max(cost, 1e-30)
                theta, r, cost = trial, r_trial, cost_trial
                damping = max(damping / 3.0, 1e-9)
                improved = drop > TOLERANCE
                break
            damping *= 4.0
        if not improved:
            break
    return Fit(_efficiency(theta), iterations, cost)


@dataclass(frozen=True)
class PointReport:
    point: MeasuredPoint
    uncalibrated: dict[str, float]  # signed error per metric with the profile's knobs
    fitted: dict[str, float]  # with the knobs fitted on every point
    left_out: dict[str, float] | None  # fitted on the other points (None: no other point)


@dataclass(frozen=True)
class Report:
    key: tuple[str, str, str]  # (hardware, framework, model)
    profile: Efficiency
    fit: Fit
    points: tuple[PointReport, ...]

    def median(self, kind: str) -> dict[str, float | None]:
        """Median |error| per metric over the points of one kind of error (None: none)."""
        per_metric: dict[str, list[float]] = {}
        for p in self.points:
            errs = getattr(p, kind)
            for metric, err in (errs or {}).items():
                per_metric.setdefault(metric, []).append(abs(err))
        return {m: (float(np.median(per_metric[m])) if per_metric.get(m) else None)
                for m in KEY_OF_METRIC}


def calibrate(points: Sequence[MeasuredPoint]) -> Report:
    """Fit one (hardware, framework, model)'s knobs on all its points and leave each out once."""
    keys = {p.key for p in points}
    if len(keys) != 1:
        raise ValueError(f"points of several setups: {sorted(keys)}")
    profile = profile_of(points[0])
    full = fit(points, profile)
    reports = []
    for i, point in enumerate(points):
        others = [p for j, p in enumerate(points) if j != i]
        left_out = (errors(point, predict(point, fit(others, profile).efficiency))
                    if others else None)
        reports.append(PointReport(point, errors(point, predict(point, None)),
                                   errors(point, predict(point, full.efficiency)), left_out))
    return Report(points[0].key, profile, full, tuple(reports))
