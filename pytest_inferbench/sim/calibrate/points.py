"""Measured points a calibration is fitted on: the plugin's own result files from real servers,
and a small CSV of published points. Each becomes a `MeasuredPoint`: the engine config its
server argv gives, the load it ran, and its measured metrics. Bad input is a
`MeasurementsError` naming the file and line.

CSV (one metric a row; `#` lines are comments, e.g. the source):

    server,hardware,isl,osl,conc,metric,value[,prompts][,range_ratio][,env]

`server` is the server argv as one shell line, or a server node of a recipe (the node name the
plugin prints, e.g. `minimaxm3-fp4-mi355x-atom-tp4`, or a config key with one node) when
`Recipes` are given: its launch spec's argv, env and files, and its hardware (the `hardware`
cell may then be empty); `metric` ttft / tpot / itl / throughput (or
the result keys mean_ttft_ms, mean_tpot_ms, mean_itl_ms, output_throughput: ms and output
tokens/s); `prompts` the number of requests (default 10 x conc), `range_ratio` the random
range ratio (default 0.8, InferenceX's), `env` the server's `NAME=VALUE` words.
"""

from __future__ import annotations

import csv
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...loadgen.workload import DEFAULT_RANGE_RATIO
from ...recipe.launch import LaunchSpecError, resolve
from ...recipe.schema import RecipeError, load_recipe
from ...results.point_files import point_record
from .. import catalog
from ..acceptance import SpecConfigError
from ..args import ArgvError, engine_config_from_argv
from ..expected_error import METRIC_OF_KEY, METRICS
from ..physics import EngineConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from ...recipe.model import ServerConfig
    from ...results.record import JSONValue
    from ..config import EngineConfig

# The result key each fitted metric is read from and predicted as.
KEY_OF_METRIC = {"ttft": "mean_ttft_ms", "tpot": "mean_tpot_ms", "throughput": "output_throughput"}
METRIC_NAMES = {**METRIC_OF_KEY, **{m: m for m in METRICS}, "itl": "tpot"}
CSV_COLUMNS = ("server", "hardware", "isl", "osl", "conc", "metric", "value")
CSV_OPTIONAL = ("prompts", "range_ratio", "env")


class MeasurementsError(ValueError):
    """Input a calibration cannot use; the message names the file (and line)."""


@dataclass(frozen=True)
class MeasuredPoint:
    source: str  # `file:line` (CSV) or the result file
    config: EngineConfig
    env: tuple[tuple[str, str], ...]
    isl: int
    osl: int
    conc: int
    prompts: int
    range_ratio: float
    values: tuple[tuple[str, float], ...]  # metric (METRICS) -> measured

    @property
    def key(self) -> tuple[str, str, str]:
        """(hardware, framework, model): what a calibration entry is fitted for."""
        return self.config.hardware, self.config.framework, self.config.model

    @property
    def label(self) -> str:
        return f"{self.isl}/{self.osl} conc {self.conc}"


@dataclass(frozen=True)
class Server:
    """How a measured server ran: what the simulator reads to simulate it."""

    argv: tuple[str, ...]
    hardware: str
    env: tuple[tuple[str, str], ...] = ()
    framework: str | None = None
    files: tuple[tuple[str, str], ...] = ()


class Recipes:
    """Server nodes of recipe files, so that a CSV row may name one instead of its argv."""

    def __init__(self, paths: Sequence[Path], launch_dir: Path | None = None) -> None:
        self.nodes: dict[str, list[ServerConfig]] = {}
        self.launch_dir = launch_dir
        for path in paths:
            try:
                servers = load_recipe(path).servers
            except (RecipeError, OSError) as exc:
                raise MeasurementsError(f"{path}: {exc}") from None
            for server in servers:
                for name in {server.node_name, server.config_key}:
                    self.nodes.setdefault(name, []).append(server)

    def server(self, where: str, name: str, hardware: str) -> Server:
        found = self.nodes.get(name, [])
        if len(found) != 1:
            known = sorted({s.node_name for nodes in self.nodes.values() for s in nodes})
            if found:
                raise MeasurementsError(
                    f"{where}: config key {name!r} has {len(found)} server nodes; name one: "
                    f"{', '.join(sorted(s.node_name for s in found))}")
            raise MeasurementsError(f"{where}: no server node {name!r} in the recipes; known: "
                                    f"{', '.join(known[:20]) or 'none'}")
        node = found[0]
        if hardware and hardware.lower() != node.hardware.lower():
            raise MeasurementsError(f"{where}: hardware {hardware!r}, but {name} runs on "
                                    f"{node.hardware}")
        launch_dir = self.launch_dir or Path(node.source).resolve().parent / "launch"
        try:
            spec = resolve(node, launch_dir)
        except LaunchSpecError as exc:
            raise MeasurementsError(f"{where}: {exc}") from None
        return Server(spec.argv, node.hardware, spec.env, spec.framework or node.framework,
                      spec.files)


def _config(where: str, server: Server) -> EngineConfig:
    try:
        config, _ = engine_config_from_argv(
            list(server.argv), hardware=server.hardware, env=dict(server.env),
            framework=server.framework, files=dict(server.files))
    except (ArgvError, catalog.CatalogError, SpecConfigError, EngineConfigError,
            ValueError) as exc:
        raise MeasurementsError(f"{where}: the simulator cannot read this server: {exc}") from None
    return config


def _positive_int(where: str, name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise MeasurementsError(f"{where}: {name} must be a whole number, got {text!r}") from None
    if value < 1:
        raise MeasurementsError(f"{where}: {name} must be at least 1, got {value}")
    return value


def _positive_float(where: str, name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise MeasurementsError(f"{where}: {name} must be a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise MeasurementsError(f"{where}: {name} must be a positive number, got {text!r}")
    return value


def read_csv(path: Path, recipes: Recipes | None = None) -> list[MeasuredPoint]:
    """The points of a CSV file: rows of the same server and load are one point."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MeasurementsError(f"{path}: cannot read: {exc}") from None
    rows = [(n, line) for n, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.lstrip().startswith("#")]
    if not rows:
        raise MeasurementsError(f"{path}: no rows; expected the header "
                                f"{','.join(CSV_COLUMNS)}")
    header_line, header_text = rows[0]
    header = [h.strip() for h in next(csv.reader([header_text]))]
    missing = [c for c in CSV_COLUMNS if c not in header]
    unknown = [c for c in header if c not in CSV_COLUMNS + CSV_OPTIONAL]
    if missing or unknown:
        what = (f"missing column {', '.join(missing)}" if missing
                else f"unknown column {', '.join(unknown)}")
        raise MeasurementsError(
            f"{path}:{header_line}: {what}; the columns are {','.join(CSV_COLUMNS)} and "
            f"optionally {','.join(CSV_OPTIONAL)}")
    # Rows of one server and load: (server, isl, osl, conc, prompts, range ratio).
    groups: dict[tuple[Server, int, int, int, int, float],
                 tuple[str, EngineConfig, dict[str, float]]] = {}
    for n, line in rows[1:]:
        where = f"{path}:{n}"
        cells = next(csv.reader([line]))
        if len(cells) != len(header):
            raise MeasurementsError(f"{where}: {len(cells)} cells, the header has "
                                    f"{len(header)}")
        row = dict(zip(header, (c.strip() for c in cells), strict=True))
        metric = METRIC_NAMES.get(row["metric"])
        if metric is None:
            raise MeasurementsError(f"{where}: unknown metric {row['metric']!r}; known: "
                                    f"{', '.join(METRIC_NAMES)}")
        value = _positive_float(where, "value", row["value"])
        conc = _positive_int(where, "conc", row["conc"])
        isl = _positive_int(where, "isl", row["isl"])
        osl = _positive_int(where, "osl", row["osl"])
        prompts = (_positive_int(where, "prompts", row["prompts"]) if row.get("prompts")
                   else 10 * conc)
        ratio = DEFAULT_RANGE_RATIO
        if row.get("range_ratio"):
            ratio = _positive_float(where, "range_ratio", row["range_ratio"])
            if ratio > 1:
                raise MeasurementsError(f"{where}: range_ratio must be within (0, 1], "
                                        f"got {ratio:g}")
        try:
            env_words = shlex.split(row.get("env") or "")
            words = shlex.split(row["server"])
        except ValueError as exc:
            raise MeasurementsError(f"{where}: the server or env column: {exc}") from None
        bad = next((w for w in env_words if "=" not in w), None)
        if bad is not None:
            raise MeasurementsError(f"{where}: env words are NAME=VALUE, got {bad!r}")
        env = tuple((name, value) for name, _, value in (w.partition("=") for w in env_words))
        if not words:
            raise MeasurementsError(f"{where}: empty server")
        if len(words) == 1 and recipes is not None:
            named = recipes.server(where, words[0], row["hardware"])
            server = Server(named.argv, named.hardware, named.env + env, named.framework,
                            named.files)
        elif not row["hardware"]:
            raise MeasurementsError(f"{where}: no hardware (a server argv needs it; a recipe's "
                                    "server node brings its own)")
        else:
            server = Server(tuple(words), row["hardware"], env)
        group = (server, isl, osl, conc, prompts, ratio)
        if group not in groups:
            groups[group] = (where, _config(where, server), {})
        first, _, values = groups[group]
        if metric in values:
            raise MeasurementsError(f"{where}: a second {metric} for the point of {first}")
        values[metric] = value
    return [MeasuredPoint(first, config, server.env, isl, osl, conc, prompts, ratio,
                          tuple(values.items()))
            for (server, isl, osl, conc, prompts, ratio), (first, config, values)
            in groups.items()]


def _record_number(record: Mapping[str, JSONValue], key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def point_of_record(where: str, record: Mapping[str, JSONValue]) -> MeasuredPoint:
    """A result record of a real server as a measured point."""
    if record.get("simulated") is not False:
        raise MeasurementsError(
            f"{where}: a simulated result (backend {record.get('backend')}): a calibration "
            "fits the simulator to measurements, not to its own predictions; give results "
            "of real servers (docker, process, external, slurm backends)")
    argv = record.get("server_argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise MeasurementsError(
            f"{where}: no server_argv in the result (written by an older pytest-inferbench, "
            "or a server the plugin did not start); rerun it, or give the point as a CSV row")
    hardware, framework = record.get("hardware"), record.get("framework")
    if not isinstance(hardware, str) or not isinstance(framework, str):
        raise MeasurementsError(f"{where}: the result names no hardware or framework")
    numbers = {k: _record_number(record, k) for k in ("isl", "osl", "conc", "num_prompts")}
    if any(v is None or v < 1 for v in numbers.values()):
        raise MeasurementsError(f"{where}: the result has no isl, osl, conc or num_prompts")
    workload = record.get("workload")
    ratio = (workload.get("random_range_ratio") if isinstance(workload, dict) else None)
    values = {m: v for m in METRICS
              if (v := _record_number(record, KEY_OF_METRIC[m])) is not None and v > 0}
    if not values:
        raise MeasurementsError(f"{where}: the result has none of "
                                f"{', '.join(KEY_OF_METRIC.values())}")
    config = _config(where, Server(tuple(str(a) for a in argv), hardware, (), framework))
    return MeasuredPoint(
        where, config, (), int(numbers["isl"] or 0), int(numbers["osl"] or 0),
        int(numbers["conc"] or 0), int(numbers["num_prompts"] or 0),
        float(ratio) if isinstance(ratio, (int, float)) else DEFAULT_RANGE_RATIO,
        tuple(values.items()))


def _result_files(path: Path) -> list[Path]:
    if path.is_dir():
        points = path / "points"
        folder = points if points.is_dir() else path
        files = sorted(p for p in folder.glob("*.json")
                       if not p.name.startswith(("agg_", ".")) and p.name != "run.json"
                       and p.name != "summary.json")
        if not files:
            raise MeasurementsError(f"{path}: no result files (points/*.json) in this directory")
        return files
    return [path]


def read_results(path: Path) -> list[MeasuredPoint]:
    """The points of a run directory, a point's raw result file or a summary.json."""
    out = []
    for file in _result_files(path):
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise MeasurementsError(f"{file}: cannot read: {exc}") from None
        except json.JSONDecodeError as exc:
            raise MeasurementsError(f"{file}:{exc.lineno}: not JSON: {exc.msg}") from None
        records: list[tuple[str, Mapping[str, JSONValue]]]
        if isinstance(data, dict) and isinstance(data.get("points"), list):  # summary.json
            records = [(f"{file} point {i + 1}", p) for i, p in enumerate(data["points"])
                       if isinstance(p, dict)]
        elif isinstance(data, dict):
            records = [(str(file), point_record(data) if "inferbench" in data else data)]
        else:
            raise MeasurementsError(f"{file}: not a result file (a JSON object expected)")
        out += [point_of_record(where, record) for where, record in records]
    return out


def read_inputs(paths: Iterable[Path], recipes: Recipes | None = None) -> list[MeasuredPoint]:
    """Every point of the given CSV files, result files and run directories."""
    points: list[MeasuredPoint] = []
    for path in paths:
        if not path.exists():
            raise MeasurementsError(f"{path}: no such file or directory")
        points += (read_csv(path, recipes) if path.suffix.lower() == ".csv"
                   else read_results(path))
    return points
