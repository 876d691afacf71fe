"""The knobs a calibration fits: `physics.Efficiency`'s fields, each with its bounds and the
unit it is written in. Declared once: the fit, the file reader and the docs read them here."""

from __future__ import annotations

from dataclasses import dataclass

from ..efficiency import Efficiency


@dataclass(frozen=True)
class Knob:
    name: str  # as written in a calibration file
    field: str  # `Efficiency`'s field
    scale: float  # file value x scale = the field's value (ms -> s)
    lower: float  # bounds, in the file's unit
    upper: float
    meaning: str


KNOBS: tuple[Knob, ...] = (
    # A step costs at least a kernel launch; 50 ms is ten times the largest profile's.
    Knob("step_overhead_ms", "step_overhead_s", 1e-3, 0.05, 50.0,
         "fixed cost of every engine step (ms)"),
    # Streaming kernels reach 50-90% of peak HBM; below 20% the roofline is not what limits.
    Knob("hbm_efficiency", "hbm_efficiency", 1.0, 0.2, 1.0,
         "achieved fraction of peak HBM bandwidth"),
    # Achieved fraction of dense peak FLOP/s: 1% (a young kernel) up to the peak itself.
    Knob("compute_efficiency", "compute_efficiency", 1.0, 0.01, 1.0,
         "achieved fraction of this chip's dense peak FLOP/s"),
)


def to_values(eff: Efficiency) -> dict[str, float]:
    """The knobs' values in the file's units."""
    return {k.name: float(getattr(eff, k.field)) / k.scale for k in KNOBS}


def from_values(values: dict[str, float]) -> Efficiency:
    return Efficiency(**{k.field: values[k.name] * k.scale for k in KNOBS})


def clamp(values: dict[str, float]) -> dict[str, float]:
    """Each value within its knob's bounds."""
    return {k.name: min(max(values[k.name], k.lower), k.upper) for k in KNOBS}


def out_of_bounds(name: str, value: float) -> str | None:
    """Why a knob's value cannot be used, or None."""
    knob = next(k for k in KNOBS if k.name == name)
    if not knob.lower <= value <= knob.upper:
        return f"{name} {value:g} is outside its bounds [{knob.lower:g}, {knob.upper:g}]"
    return None
