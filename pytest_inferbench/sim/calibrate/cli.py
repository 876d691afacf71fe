"""`python -m pytest_inferbench.sim calibrate INPUT... [-o FILE]`: fit the knobs per (hardware,
framework, model) to the measured points of the inputs, print the leave-one-out report, write
the calibration file (entries of other setups already in it are kept)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ...results.build import WriteError
from . import file as calibration_file
from .fit import Report, calibrate
from .knobs import KNOBS, to_values
from .points import MeasuredPoint, MeasurementsError, Recipes, read_inputs

if TYPE_CHECKING:
    from collections.abc import Sequence

DEFAULT_OUTPUT = "sim-calibration.yaml"
METRIC_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "throughput": "throughput"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pytest_inferbench.sim calibrate",
        description="Fit the simulator's efficiency knobs to measured points and write a "
                    "calibration file for --inferbench-sim-calibration.")
    p.add_argument("inputs", nargs="+", type=Path, metavar="INPUT",
                   help="a results directory of a run on real servers, a point's result JSON, "
                        "a summary.json, or a CSV of published points (server,hardware,isl,osl,"
                        "conc,metric,value[,prompts,range_ratio,env]; server: an argv, or a "
                        "server node of a --recipe)")
    p.add_argument("--recipe", type=Path, action="append", default=[], metavar="FILE",
                   help="a master config whose server nodes CSV rows may name instead of an "
                        "argv (its launch specs: launch/ beside it, or --launch-dir)")
    p.add_argument("--launch-dir", type=Path, default=None, metavar="DIR",
                   help="directory of the recipes' launch specs")
    p.add_argument("-o", "--output", type=Path, default=Path(DEFAULT_OUTPUT), metavar="FILE",
                   help=f"the calibration file to write (default {DEFAULT_OUTPUT})")
    return p


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _abs_pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1%}"


def render(report: Report) -> list[str]:
    """The report of one setup: knobs, then each point's errors, then the medians."""
    hardware, framework, model = report.key
    fitted, profile = to_values(report.fit.efficiency), to_values(report.profile)
    lines = [f"{hardware}, {framework}, {model}: {len(report.points)} measured points, "
             f"fit in {report.fit.iterations} iterations"]
    for knob in KNOBS:
        value = fitted[knob.name]
        # Within rounding of a bound: the points pushed it there (docs: how to read it).
        at_bound = min(abs(value / knob.lower - 1), abs(value / knob.upper - 1)) < 1e-6
        lines.append(f"  {knob.name:<20} {profile[knob.name]:.4g} -> {value:.4g}"
                     f"{' (at its bound)' if at_bound else ''}   [{knob.lower:g}, "
                     f"{knob.upper:g}] {knob.meaning}")
    lines.append(f"  {'point / metric':<24} {'measured':>9}  {'uncalibrated':>12}  "
                 f"{'fitted':>7}  {'left out':>8}")
    for p in report.points:
        lines.append(f"  {p.point.label} ({p.point.source})")
        for metric, measured in p.point.values:
            left = None if p.left_out is None else p.left_out[metric]
            lines.append(f"    {METRIC_LABELS[metric]:<22} {measured:>9.4g}  "
                         f"{_pct(p.uncalibrated[metric]):>12}  {_pct(p.fitted[metric]):>7}  "
                         f"{_pct(left):>8}")
    for kind, name in (("uncalibrated", "uncalibrated"), ("fitted", "fitted (in sample)"),
                       ("left_out", "leave-one-out")):
        medians = report.median(kind)
        lines.append(f"  median |error| {name}: " + ", ".join(
            f"{METRIC_LABELS[m]} {_abs_pct(v)}" for m, v in medians.items()
            if any(m in dict(p.point.values) for p in report.points)))
    return lines


def entry_of(report: Report) -> calibration_file.Entry:
    errors = tuple((kind, tuple(report.median(key).items())) for kind, key in
                   (("fitted", "fitted"), ("leave_one_out", "left_out"),
                    ("uncalibrated", "uncalibrated")))
    hardware, framework, model = report.key
    return calibration_file.Entry(
        hardware, framework, model, tuple(to_values(report.fit.efficiency).items()),
        len(report.points), errors, tuple(p.point.source for p in report.points))


def run(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    kept: tuple[calibration_file.Entry, ...] = ()
    try:
        if args.output.exists():
            # Only a calibration file is replaced; its entries for other setups stay.
            kept = calibration_file.load(args.output).entries
        recipes = Recipes(args.recipe, args.launch_dir) if args.recipe else None
        points = read_inputs(args.inputs, recipes)
    except (MeasurementsError, calibration_file.CalibrationFileError) as exc:
        print(f"calibrate: error: {exc}", file=sys.stderr)
        if isinstance(exc, calibration_file.CalibrationFileError):
            print(f"calibrate: {args.output} exists and is not a calibration file: not "
                  "overwritten; choose another --output", file=sys.stderr)
        return 2
    by_key: dict[tuple[str, str, str], list[MeasuredPoint]] = {}
    for point in points:
        by_key.setdefault(point.key, []).append(point)
    entries = []
    lines: list[str] = []
    for group in by_key.values():
        report = calibrate(group)
        lines.extend(render(report))
        entries.append(entry_of(report))
    fitted = {e.key for e in entries}
    merged = [e for e in kept if e.key not in fitted] + entries
    # Written before anything is printed: a reader that stops early (`| head`) loses no fit.
    try:
        calibration_file.write(args.output, merged)
    except WriteError as exc:
        print("\n".join(lines))
        print(f"calibrate: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    print(f"wrote {args.output} ({len(entries)} fitted, {len(merged) - len(entries)} kept); "
          f"use it with --inferbench-sim-calibration {args.output}")
    return 0
