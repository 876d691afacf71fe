"""The calibration file: fitted knobs per (hardware, framework, model), written atomically as
YAML, read back with `file:line` errors, and applied to an engine config.

    format: pytest-inferbench sim calibration
    version: 1
    entries:
    - hardware: MI355X
      framework: atom
      model: amd/MiniMax-M3-MXFP4
      knobs: {step_overhead_ms: 3.9, hbm_efficiency: 0.79, compute_efficiency: 0.061}
      points: 4                      # measured points the knobs were fitted on
      error:                         # median |error| per metric (a fraction; null: unknown)
        fitted: {ttft: 0.04, tpot: 0.01, throughput: 0.01}
        leave_one_out: {ttft: 0.07, tpot: 0.03, throughput: 0.02}
        uncalibrated: {ttft: 0.11, tpot: 0.02, throughput: 0.03}
      sources: [sweep.csv:4, ...]

Only `hardware`, `framework`, `model` and `knobs` are needed to simulate; the rest says how
far the calibration can be trusted, and the leave-one-out figures become the expected error
of the points it prices (`expected_error`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import yaml

from ...results.build import write_text_atomic
from ...util import yamllines
from .. import catalog
from ..expected_error import METRICS
from .knobs import KNOBS, from_values, out_of_bounds

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from ...results.record import JSONValue
    from ..config import EngineConfig
    from ..efficiency import Efficiency

FORMAT = "pytest-inferbench sim calibration"
VERSION = 1
ERROR_KINDS = ("fitted", "leave_one_out", "uncalibrated")


class CalibrationFileError(ValueError):
    """A calibration file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Entry:
    hardware: str  # catalog names, as an EngineConfig holds them
    framework: str
    model: str
    knobs: tuple[tuple[str, float], ...]  # in the file's units (`knobs.KNOBS`)
    points: int = 0
    # kind -> metric -> median |error| (None: unknown), kinds of ERROR_KINDS
    error: tuple[tuple[str, tuple[tuple[str, float | None], ...]], ...] = ()
    sources: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return self.hardware, self.framework, self.model

    @property
    def efficiency(self) -> Efficiency:
        return from_values(dict(self.knobs))

    def errors(self, kind: str) -> dict[str, float | None]:
        return dict(dict(self.error).get(kind, ()))


@dataclass(frozen=True)
class Calibration:
    path: str  # as the user gave it: records and tables name it
    entries: tuple[Entry, ...]

    def entry_for(self, config: EngineConfig) -> Entry | None:
        key = (config.hardware, config.framework, config.model)
        return next((e for e in self.entries if e.key == key), None)

    def apply(self, config: EngineConfig) -> EngineConfig:
        """The config with this calibration's knobs where it has an entry for it."""
        entry = self.entry_for(config)
        if entry is None:
            return config
        return replace(config, efficiency=entry.efficiency, calibration=self.describe(entry))

    def describe(self, entry: Entry) -> str:
        """`calib.yaml (MI355X, atom, amd/MiniMax-M3-MXFP4; 4 points)`."""
        return (f"{self.path} ({entry.hardware}, {entry.framework}, {entry.model}; "
                f"{entry.points} points)")

    def keys_text(self) -> str:
        return "; ".join(", ".join(e.key) for e in self.entries) or "none"

    def note(self, config: EngineConfig) -> str:
        """What a point's record says about the calibration it ran with (or without)."""
        entry = self.entry_for(config)
        if entry is None:
            return (f"sim calibration {self.path} has no entry for {config.hardware}, "
                    f"{config.framework}, {config.model} (it has: {self.keys_text()}): the "
                    "framework profile's knobs priced this point")
        knobs = ", ".join(f"{name} {value:.4g}" for name, value in entry.knobs)
        return f"calibrated by {self.describe(entry)}: {knobs}"


def expected_error(entry: Entry, described: str) -> dict[str, JSONValue]:
    """A calibrated point's `expected_error` record: the calibration's leave-one-out median
    |error| per metric (points it did not see), in the shape `sim.expected_error` gives."""
    loo = entry.errors("leave_one_out")
    out: dict[str, JSONValue] = {"regime": f"calibrated by {described}"}
    for metric in METRICS:
        out[metric] = loo.get(metric)
    out["points"] = {m: entry.points for m in METRICS}
    out["source"] = f"leave-one-out over the calibration's {entry.points} measured points"
    out["calibration"] = described
    return out


# -- writing ---------------------------------------------------------------------------------


def entry_data(entry: Entry) -> dict[str, object]:
    return {
        "hardware": entry.hardware, "framework": entry.framework, "model": entry.model,
        "knobs": {name: round(value, 6) for name, value in entry.knobs},
        "points": entry.points,
        "error": {kind: {m: None if v is None else round(v, 4) for m, v in values}
                  for kind, values in entry.error},
        "sources": list(entry.sources),
    }


def write(path: Path, entries: Sequence[Entry]) -> None:
    """The file, atomically (a reader never sees half of it); `WriteError` if it cannot be."""
    data = {"format": FORMAT, "version": VERSION, "entries": [entry_data(e) for e in entries]}
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
    write_text_atomic(path, [text])


# -- reading ---------------------------------------------------------------------------------


def _fail(path: object, line: int, problem: str) -> CalibrationFileError:
    return CalibrationFileError(f"{path}:{line}: {problem}")


def _mapping(path: object, node: yamllines.Node, what: str) -> dict[str, yamllines.Node]:
    if not isinstance(node, yamllines.MappingNode):
        raise _fail(path, yamllines.line_of(node),
                    f"{what} must be a mapping, got {yamllines.describe(node)}")
    out: dict[str, yamllines.Node] = {}
    for key, value in node.value:
        out[str(yamllines.to_python(key))] = value
    return out


def _text(path: object, node: yamllines.Node, what: str) -> str:
    value = yamllines.to_python(node) if isinstance(node, yamllines.ScalarNode) else None
    if not isinstance(value, str) or not value:
        raise _fail(path, yamllines.line_of(node),
                    f"{what} must be a text, got {yamllines.describe(node)}")
    return value


def _number(path: object, node: yamllines.Node, what: str) -> float:
    value = yamllines.to_python(node) if isinstance(node, yamllines.ScalarNode) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise _fail(path, yamllines.line_of(node),
                    f"{what} must be a number, got {yamllines.describe(node)}")
    return float(value)


def _entry(path: object, node: yamllines.Node, index: int) -> Entry:
    where = f"entries[{index}]"
    fields = _mapping(path, node, where)
    line = yamllines.line_of(node)
    for name in ("hardware", "framework", "model", "knobs"):
        if name not in fields:
            raise _fail(path, line, f"{where} has no {name!r}")
    try:
        hardware = catalog.hardware(_text(path, fields["hardware"], "hardware")).name
        framework = catalog.framework(_text(path, fields["framework"], "framework")).name
        model = catalog.checkpoint(_text(path, fields["model"], "model")).name
    except catalog.CatalogError as exc:
        raise _fail(path, line, f"{where}: {exc}") from None
    knob_nodes = _mapping(path, fields["knobs"], f"{where}.knobs")
    names = [k.name for k in KNOBS]
    unknown = sorted(set(knob_nodes) - set(names))
    if unknown:
        raise _fail(path, yamllines.line_of(fields["knobs"]),
                    f"unknown knob {unknown[0]!r}; known: {', '.join(names)}")
    knobs: list[tuple[str, float]] = []
    for name in names:
        if name not in knob_nodes:
            raise _fail(path, yamllines.line_of(fields["knobs"]), f"{where}.knobs has no {name!r}")
        value = _number(path, knob_nodes[name], name)
        problem = out_of_bounds(name, value)
        if problem:
            raise _fail(path, yamllines.line_of(knob_nodes[name]), problem)
        knobs.append((name, value))
    points = int(_number(path, fields["points"], "points")) if "points" in fields else 0
    error: list[tuple[str, tuple[tuple[str, float | None], ...]]] = []
    if "error" in fields:
        for kind, kind_node in _mapping(path, fields["error"], f"{where}.error").items():
            values: list[tuple[str, float | None]] = []
            for metric, value_node in _mapping(path, kind_node, f"error.{kind}").items():
                none = (isinstance(value_node, yamllines.ScalarNode)
                        and yamllines.to_python(value_node) is None)
                values.append((metric, None if none
                               else _number(path, value_node, f"error.{kind}.{metric}")))
            error.append((kind, tuple(values)))
    sources: tuple[str, ...] = ()
    if "sources" in fields:
        raw = yamllines.to_python(fields["sources"])
        sources = tuple(str(s) for s in raw) if isinstance(raw, list) else ()
    return Entry(hardware, framework, model, tuple(knobs), points, tuple(error), sources)


def load(path: Path, shown: str | None = None) -> Calibration:
    """Read a calibration file; `CalibrationFileError` (`file:line: ...`) if it cannot be used.
    `shown`: how records and messages name it (default: the path as given)."""
    name = shown if shown is not None else str(path)
    try:
        text = yamllines.read_text(path)
        root = yamllines.compose(text)
    except OSError as exc:
        raise CalibrationFileError(f"{name}: cannot read the calibration file: "
                                   f"{exc.strerror or exc}") from None
    except yamllines.YamlSyntaxError as exc:
        raise _fail(name, exc.line, f"not YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = int(mark.line) + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise _fail(name, line, f"not YAML: {problem}") from None
    if root is None:
        raise _fail(name, 1, "empty; expected a calibration file written by "
                             "`python -m pytest_inferbench.sim calibrate`")
    top = _mapping(name, root, "a calibration file")
    fmt = yamllines.to_python(top["format"]) if "format" in top else None
    if fmt != FORMAT:
        raise _fail(name, yamllines.line_of(top.get("format", root)),
                    f"not a calibration file (format {fmt!r}, expected {FORMAT!r}); write one "
                    "with `python -m pytest_inferbench.sim calibrate`")
    version = yamllines.to_python(top["version"]) if "version" in top else None
    if version != VERSION:
        raise _fail(name, yamllines.line_of(top.get("version", root)),
                    f"calibration file version {version!r} not supported (expected {VERSION})")
    entries_node = top.get("entries")
    if not isinstance(entries_node, yamllines.SequenceNode) or not entries_node.value:
        raise _fail(name, yamllines.line_of(entries_node or root),
                    "no entries: a calibration file holds at least one fitted entry")
    entries = tuple(_entry(name, node, i) for i, node in enumerate(entries_node.value))
    seen: set[tuple[str, str, str]] = set()
    for node, entry in zip(entries_node.value, entries, strict=True):
        if entry.key in seen:
            raise _fail(name, yamllines.line_of(node),
                        f"a second entry for {', '.join(entry.key)}")
        seen.add(entry.key)
    return Calibration(name, entries)
