"""The simulator against public measurements: prints the reference table of docs/simulator.md.

Each row is one published serving measurement (vendor or framework pages, a public benchmark
sweep), the server argv it states or implies, the load it ran, and the measured value; the
points live in `sim_reference.yaml` beside this script (`--data` reads another file). The
simulator predicts the same metric under the same load; the table shows both and the error,
then the median and worst |error| per metric. Nothing here feeds back into the simulator: the
errors are what they are.

With `--write PATH` it also writes the expected error of a simulated point per regime (the
median |error| of the reference rows and the calibration table in each, `sim/expected_error.py`)
to PATH; the packaged table is this output, and a test checks that it still is:

    python benchmarks/sim_reference.py
    python benchmarks/sim_reference.py --write pytest_inferbench/sim/expected_error.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from pytest_inferbench.loadgen.workload import LoadSettings, build_workload
from pytest_inferbench.results.metrics import summarize
from pytest_inferbench.sim import calibration, expected_error
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.driver import simulate_point

ATOM_M3 = list(calibration.ARGV)
ATOM_ENV = tuple(calibration.ENV.items())
DATA_FILE = Path(__file__).with_name("sim_reference.yaml")
POINT_KEYS = {"label", "source", "argv", "hardware", "isl", "osl", "conc", "prompts",
              "range_ratio", "env", "measured", "assumed", "template_tokens"}
# The metric each published value counts as: the expected-error table's, plus the medians a
# source may publish instead of means (ATOM's GLM-5.2 table), compared median to median. Only
# here: a calibration input still takes means.
METRIC_OF_KEY = {**expected_error.METRIC_OF_KEY, "median_ttft_ms": "ttft",
                 "median_tpot_ms": "tpot"}
REQUIRED_KEYS = ("label", "source", "argv", "hardware", "isl", "osl", "conc", "prompts",
                 "measured")


@dataclass(frozen=True)
class Reference:
    label: str
    source: str
    argv: list[str]
    hardware: str
    isl: int
    osl: int
    conc: int
    prompts: int
    metric: str  # a metrics.summarize key
    measured: float
    range_ratio: float = 1.0  # 1.0 = every request exactly isl / osl tokens
    env: tuple[tuple[str, str], ...] = ()
    assumed: str = ""  # a setting the source does not state, and the value chosen for it
    # What the server's chat template adds to every prompt: a client that sends the random
    # prompt as a chat message (`vllm bench serve --backend openai-chat`) asks for `isl`
    # tokens of text, and the engine prefills those plus the template's.
    template_tokens: int = 0


class DataError(ValueError):
    """A data file entry the script cannot read: the message names the file and the point."""


def _point_rows(point: object, sources: dict[str, str], where: str) -> list[Reference]:
    if not isinstance(point, dict):
        raise DataError(f"{where}: a point is a mapping, got {type(point).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in point]
    unknown = sorted(set(point) - POINT_KEYS)
    if missing or unknown:
        raise DataError(f"{where}: missing {missing}, unknown {unknown}")
    if point["source"] not in sources:
        raise DataError(f"{where}: source {point['source']!r} is not under `sources`")
    measured = point["measured"]
    if not isinstance(measured, dict) or not measured:
        raise DataError(f"{where}: `measured` is a mapping of metric to published value")
    bad = sorted(set(measured) - set(METRIC_OF_KEY))
    if bad:
        raise DataError(f"{where}: unknown metric(s) {bad}; known: "
                        f"{sorted(METRIC_OF_KEY)}")
    template = point.get("template_tokens", 0)
    if not isinstance(template, int) or isinstance(template, bool) or template < 0:
        raise DataError(f"{where}: template_tokens is a count of tokens (0 or more), "
                        f"got {template!r}")
    try:
        return [Reference(str(point["label"]), str(point["source"]),
                          [str(a) for a in point["argv"]], str(point["hardware"]),
                          int(point["isl"]), int(point["osl"]), int(point["conc"]),
                          int(point["prompts"]), metric, float(value),
                          float(point.get("range_ratio", 1.0)),
                          tuple((str(k), str(v)) for k, v in (point.get("env") or {}).items()),
                          str(point.get("assumed", "")), template)
                for metric, value in measured.items()]
    except (TypeError, ValueError) as exc:
        raise DataError(f"{where}: {exc}") from exc


def load_references(path: Path = DATA_FILE) -> list[Reference]:
    """One row per published metric of each point in the data file."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("sources"), dict) \
            or not isinstance(data.get("points"), list):
        raise DataError(f"{path}: expected a mapping with `sources` and a list of `points`")
    rows: list[Reference] = []
    for index, point in enumerate(data["points"], 1):
        label = point.get("label", "?") if isinstance(point, dict) else "?"
        rows += _point_rows(point, data["sources"], f"{path}: point {index} ({label})")
    return rows


# The calibration set's two headline numbers head the table; the data file has the rest.
ATOM_ROWS = [
    Reference("MiniMax-M3 MXFP4, ATOM, 4xMI355X, conc 4", "atom", ATOM_M3, calibration.HARDWARE,
              calibration.ISL, calibration.OSL, 4, 40, "mean_tpot_ms",
              calibration.MEASURED[4][1], 0.8, ATOM_ENV),
    Reference("MiniMax-M3 MXFP4, ATOM, 4xMI355X, conc 64", "atom", ATOM_M3, calibration.HARDWARE,
              calibration.ISL, calibration.OSL, 64, 640, "output_throughput",
              calibration.MEASURED[64][2], 0.8, ATOM_ENV),
]


def references(path: Path = DATA_FILE) -> list[Reference]:
    return ATOM_ROWS + load_references(path)


# The calibration table (tests/sim/test_calibration.py), each of its numbers a row: in-sample
# for the calibrated family, the only points there are of it. Its conc 4 TPOT and conc 64
# throughput are the [atom] rows above, counted once.
CALIBRATION_ROWS = [
    Reference(f"MiniMax-M3 MXFP4, ATOM, 4xMI355X, conc {conc}", "atom", ATOM_M3,
              calibration.HARDWARE, calibration.ISL, calibration.OSL, conc, 10 * conc, metric,
              calibration.MEASURED[conc][index], 0.8, ATOM_ENV)
    for conc in sorted(calibration.MEASURED)
    for index, metric in enumerate(("mean_ttft_ms", "mean_tpot_ms", "output_throughput"))]
SOURCE = "docs/simulator.md reference and calibration tables"


def predict(ref: Reference) -> float:
    return _predict(ref)[0]


def _predict(ref: Reference) -> tuple[float, str]:
    """The simulated metric and the row's regime."""
    summary, regime = _simulate(tuple(ref.argv), ref.hardware, ref.env,
                                ref.isl + ref.template_tokens, ref.osl,
                                ref.conc, ref.prompts, ref.range_ratio)
    return summary[ref.metric], regime


@cache
def _simulate(argv: tuple[str, ...], hardware: str, env: tuple[tuple[str, str], ...], isl: int,
              osl: int, conc: int, prompts: int,
              range_ratio: float) -> tuple[dict[str, float], str]:
    """One simulated run per point, whatever number of its metrics the source published."""
    config, _ = engine_config_from_argv(list(argv), hardware=hardware, env=dict(env))
    per_conc = max(prompts // conc, 1)
    load = LoadSettings(prompts_per_conc=per_conc, range_ratio=range_ratio)
    point = simulate_point(config, build_workload(isl, osl, conc, load))
    s = summarize(point.records, duration_s=point.duration_s, num_prompts=per_conc * conc,
                  max_concurrency=conc, num_gpus=config.tp)
    values = {key: float(s[key]) for key in METRIC_OF_KEY}
    return values, expected_error.regime(config, isl, osl, conc)


def error_table(rows: list[Reference]) -> dict[str, object]:
    """The expected-error data file's content, computed from the reference rows (the [atom]
    ones counted once, through the calibration table)."""
    rows = [ref for ref in rows if ref.source != "atom"] + CALIBRATION_ROWS
    errors: dict[str, dict[str, list[float]]] = {}
    for ref in rows:
        got, regime = _predict(ref)
        metric = METRIC_OF_KEY[ref.metric]
        errors.setdefault(regime, {}).setdefault(metric, []).append(abs(got / ref.measured - 1))
    return expected_error.table_json(expected_error.figures(errors), SOURCE)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def summary_lines(errors: dict[str, list[float]]) -> list[str]:
    """Median and worst |error| per metric (TTFT, TPOT, throughput) and over all rows."""
    lines = ["| metric | rows | median abs error | worst abs error |", "|---|---:|---:|---:|"]
    every = [e for metric in expected_error.METRICS for e in errors.get(metric, [])]
    for name, values in [*((m, errors.get(m, [])) for m in expected_error.METRICS),
                         ("all", every)]:
        if values:
            lines.append(f"| {name} | {len(values)} | {_median(values):.0%} | "
                         f"{max(values):.0%} |")
        else:
            lines.append(f"| {name} | 0 | - | - |")
    return lines


def table(rows: list[Reference]) -> tuple[list[str], dict[str, list[float]]]:
    """The reference table (one line per row) and the |error| of each row per metric."""
    lines = ["| point (input/output) | source | metric | measured | simulated | error |",
             "|---|---|---|---:|---:|---:|"]
    errors: dict[str, list[float]] = {}
    for ref in rows:
        try:
            got = predict(ref)
        except ValueError as exc:  # an argv or hardware the simulator does not know
            raise DataError(f"point {ref.label} ({ref.isl}/{ref.osl}): {exc}") from exc
        err = got / ref.measured - 1.0
        errors.setdefault(METRIC_OF_KEY[ref.metric], []).append(abs(err))
        mark = " *" if ref.assumed else ""
        lines.append(f"| {ref.label} ({ref.isl}/{ref.osl}){mark} | [{ref.source}] | "
                     f"{ref.metric} | {ref.measured:g} | {got:.4g} | {err:+.0%} |")
    return lines, errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_FILE, metavar="PATH",
                        help="the published points (default: %(default)s)")
    parser.add_argument("--write", type=Path, metavar="PATH",
                        help="also write the expected error per regime (JSON) to PATH")
    args = parser.parse_args(argv)
    try:
        rows = references(args.data)
    except (OSError, ValueError, yaml.YAMLError) as exc:  # DataError is a ValueError
        parser.exit(2, f"sim_reference: {exc}\n")
    try:
        lines, errors = table(rows)
    except DataError as exc:
        parser.exit(2, f"sim_reference: {args.data}: {exc}\n")
    print("\n".join(lines))
    print("\n(* a setting the source does not state was assumed: see `assumed` in the data file)")
    print()
    print("\n".join(summary_lines(errors)))
    if args.write is not None:
        args.write.write_text(json.dumps(error_table(rows), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
