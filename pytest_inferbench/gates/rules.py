"""The SLO gates file: YAML with line marks -> frozen rules, or one `GatesFileError` (file:line).

Format (`benchmarks/gates.yaml` next to the recipes, or `--inferbench-gates=PATH`)::

    slo:
      - match: {config: "minimaxm3-*", isl: 8192, osl: 1024, conc: "1-64"}
        require:
          - p99_ttft <= 2.0          # any result key; seconds-based InferenceX keys
          - tput_per_gpu >= 500
          - golden_al_delta <= 0.3   # |measured AL - golden AL|
    regression:
      tolerance: 0.05                # default relative tolerance against the baseline
      metrics: {p99_ttft: 0.10}      # per-metric tolerance (adds the metric to the checked set)

Every `match` key is optional; `conc` takes an int, "lo-hi" or [lo, hi]. Directions are
explicit: only `>=` and `<=` are accepted, so a rule never leaves its sense to a guess.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..results import catalog
from ..util import yamllines
from .baseline import BaselineError, higher_is_better

OPERATORS = (">=", "<=")
GOLDEN_AL_DELTA = "golden_al_delta"  # virtual result key: |acceptance_length - golden AL|
MATCH_KEYS = ("config", "isl", "osl", "conc")
_REQUIRE_RE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(>=|<=|==|=|>|<)\s*(-?[0-9.eE+-]+)\s*$")


def known_metrics() -> frozenset[str]:
    """The metric keys of a point's record (the metric catalog's), plus `golden_al_delta` and
    the point's numbers (isl, osl, conc, tp, ep)."""
    return frozenset({*catalog.all_record_keys(), GOLDEN_AL_DELTA, "isl", "osl", "conc", "tp",
                      "ep"})


def _suggest(name: str) -> str:
    close = difflib.get_close_matches(name, sorted(known_metrics()), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class GatesFileError(Exception):
    """The gates file is malformed; the message lists every `file:line: problem`."""


@dataclass(frozen=True)
class Requirement:
    metric: str
    op: str  # ">=" or "<="
    threshold: float
    line: int

    def holds(self, value: float) -> bool:
        return value >= self.threshold if self.op == ">=" else value <= self.threshold

    @property
    def violated_op(self) -> str:
        return "<" if self.op == ">=" else ">"


@dataclass(frozen=True)
class SloRule:
    configs: tuple[str, ...]  # glob patterns; empty = every config
    isl: int | None
    osl: int | None
    conc_range: tuple[int, int] | None
    requirements: tuple[Requirement, ...]
    line: int

    def matches(self, config_names: tuple[str, ...], isl: int, osl: int, conc: int) -> bool:
        if self.configs and not any(
            fnmatch.fnmatchcase(name, pattern) for pattern in self.configs for name in config_names
        ):
            return False
        if self.isl is not None and self.isl != isl:
            return False
        if self.osl is not None and self.osl != osl:
            return False
        if self.conc_range is not None:
            lo, hi = self.conc_range
            return lo <= conc <= hi
        return True


@dataclass(frozen=True)
class RegressionPolicy:
    default_tolerance: float = 0.05
    tolerances: tuple[tuple[str, float], ...] = ()  # per-metric overrides, file order
    line: int = 0

    def tolerance_for(self, metric: str) -> float:
        return dict(self.tolerances).get(metric, self.default_tolerance)


@dataclass(frozen=True)
class GatesFile:
    path: Path | None
    rules: tuple[SloRule, ...] = ()
    regression: RegressionPolicy = RegressionPolicy()

    def location(self, line: int) -> str:
        return f"{display_path(self.path)}:{line}" if self.path else f"line {line}"


def display_path(path: Path | None) -> str:
    """A path relative to the working directory when it lies below it (shorter messages)."""
    if path is None:
        return "<none>"
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def load_gates_file(path: Path) -> GatesFile:
    try:
        text = yamllines.read_text(path)
    except OSError as exc:
        raise GatesFileError(f"{path}: cannot read gates file: {exc.strerror or exc}") from None
    except yamllines.YamlSyntaxError as exc:
        raise GatesFileError(f"{display_path(path)}:{exc.line}: {exc.problem}") from None
    return parse_gates(text, path)


def parse_gates(text: str, path: Path | None = None) -> GatesFile:
    where = display_path(path) if path else "<gates>"
    try:
        root = yamllines.compose(text)
    except yamllines.YamlSyntaxError as exc:
        raise GatesFileError(f"{where}:{exc.line}: invalid YAML: {exc.problem}") from None
    parser = _Parser(where)
    gates = parser.gates_file(root, path)
    if parser.errors:
        raise GatesFileError("\n".join(parser.errors))
    return gates


class _Parser:
    """Walks the composed YAML nodes so every error keeps its line number."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.errors: list[str] = []

    def error(self, node: yaml.Node, message: str) -> None:
        self.errors.append(f"{self.where}:{node.start_mark.line + 1}: {message}")

    def gates_file(self, root: yaml.Node | None, path: Path | None) -> GatesFile:
        if root is None:
            return GatesFile(path)
        if not isinstance(root, yaml.MappingNode):
            self.error(root, "the gates file must be a mapping with 'slo' and/or 'regression'")
            return GatesFile(path)
        rules: list[SloRule] = []
        regression = RegressionPolicy()
        for key_node, value in root.value:
            key = _key(key_node)
            if key == "slo":
                rules.extend(self.slo_list(value))
            elif key == "regression":
                regression = self.regression(value)
            else:
                self.error(key_node, f"unknown key {key!r} (expected 'slo' or 'regression')")
        return GatesFile(path, tuple(rules), regression)

    def slo_list(self, node: yaml.Node) -> list[SloRule]:
        if not isinstance(node, yaml.SequenceNode):
            self.error(node, "'slo' must be a list of rules")
            return []
        return [rule for item in node.value if (rule := self.slo_rule(item)) is not None]

    def slo_rule(self, node: yaml.Node) -> SloRule | None:
        if not isinstance(node, yaml.MappingNode):
            self.error(node, "an slo rule must be a mapping with 'match' and 'require'")
            return None
        fields = {_key(k): (k, v) for k, v in node.value}
        for name, (key_node, _) in fields.items():
            if name not in ("match", "require"):
                self.error(key_node, f"unknown key {name!r} in slo rule (expected match, require)")
        configs: tuple[str, ...] = ()
        isl = osl = None
        conc_range = None
        if "match" in fields:
            configs, isl, osl, conc_range = self.match(fields["match"][1])
        if "require" not in fields:
            self.error(node, "slo rule without 'require'")
            return None
        requirements = self.requirements(fields["require"][1])
        return SloRule(configs, isl, osl, conc_range, tuple(requirements), node.start_mark.line + 1)

    def match(
        self, node: yaml.Node
    ) -> tuple[tuple[str, ...], int | None, int | None, tuple[int, int] | None]:
        configs: tuple[str, ...] = ()
        isl = osl = None
        conc_range = None
        if not isinstance(node, yaml.MappingNode):
            self.error(node, "'match' must be a mapping of config/isl/osl/conc")
            return configs, isl, osl, conc_range
        for key_node, value in node.value:
            key = _key(key_node)
            if key == "config":
                configs = self.strings(value)
            elif key in ("isl", "osl"):
                number = self.integer(value, key)
                isl, osl = (number, osl) if key == "isl" else (isl, number)
            elif key == "conc":
                conc_range = self.conc(value)
            else:
                self.error(
                    key_node, f"unknown match key {key!r} (expected {', '.join(MATCH_KEYS)})"
                )
        return configs, isl, osl, conc_range

    def strings(self, node: yaml.Node) -> tuple[str, ...]:
        if isinstance(node, yaml.ScalarNode):
            return (str(node.value),)
        if isinstance(node, yaml.SequenceNode) and all(
            isinstance(n, yaml.ScalarNode) for n in node.value
        ):
            return tuple(str(n.value) for n in node.value)
        self.error(node, "'config' must be a glob or a list of globs")
        return ()

    def integer(self, node: yaml.Node, what: str) -> int | None:
        if isinstance(node, yaml.ScalarNode) and re.fullmatch(r"\d+", str(node.value)):
            return int(node.value)
        self.error(node, f"{what!r} must be a positive integer, got {_show(node)}")
        return None

    def conc(self, node: yaml.Node) -> tuple[int, int] | None:
        bounds: list[str] = []
        if isinstance(node, yaml.ScalarNode):
            bounds = str(node.value).split("-", 1)
        elif isinstance(node, yaml.SequenceNode) and len(node.value) == 2:
            bounds = [str(getattr(n, "value", "")) for n in node.value]
        if len(bounds) == 1:
            bounds = bounds * 2
        if len(bounds) == 2 and all(re.fullmatch(r"\s*\d+\s*", b) for b in bounds):
            lo, hi = int(bounds[0]), int(bounds[1])
            if lo <= hi:
                return lo, hi
        self.error(node, f"'conc' must be N, 'LO-HI' or [LO, HI] with LO <= HI, got {_show(node)}")
        return None

    def requirements(self, node: yaml.Node) -> list[Requirement]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            self.error(node, "'require' must be a non-empty list like ['p99_ttft <= 2.0']")
            return []
        out: list[Requirement] = []
        for item in node.value:
            line = item.start_mark.line + 1
            text = str(item.value) if isinstance(item, yaml.ScalarNode) else ""
            found = _REQUIRE_RE.match(text)
            if not found:
                self.error(
                    item,
                    f"cannot read requirement {_show(item)}: "
                    "expected '<result key> >= <number>' or '<result key> <= <number>'",
                )
                continue
            metric, op, number = found.groups()
            if op not in OPERATORS:
                self.error(
                    item,
                    f"operator {op!r} in {text!r}: use '>=' or '<=' so the direction is explicit",
                )
                continue
            if metric not in known_metrics():
                self.error(item, f"{metric!r} is not a result key{_suggest(metric)}")
                continue
            try:
                threshold = float(number)
            except ValueError:
                self.error(item, f"{number!r} in {text!r} is not a number")
                continue
            if not math.isfinite(threshold):
                self.error(item, f"{number!r} in {text!r} is not a finite number")
                continue
            out.append(Requirement(metric, op, threshold, line))
        return out

    def regression(self, node: yaml.Node) -> RegressionPolicy:
        if not isinstance(node, yaml.MappingNode):
            self.error(node, "'regression' must be a mapping with 'tolerance' and/or 'metrics'")
            return RegressionPolicy()
        default = 0.05
        tolerances: list[tuple[str, float]] = []
        for key_node, value in node.value:
            key = _key(key_node)
            if key == "tolerance":
                parsed = self.fraction(value)
                default = default if parsed is None else parsed
            elif key == "metrics" and isinstance(value, yaml.MappingNode):
                for metric_node, tol_node in value.value:
                    metric = _key(metric_node)
                    if not isinstance(metric_node, yaml.ScalarNode):
                        self.error(metric_node, "a regression metric must be a result key")
                        continue
                    if metric not in known_metrics():
                        self.error(metric_node, f"regression metric {metric!r} is not a result "
                                   f"key{_suggest(metric)}")
                        continue
                    try:
                        higher_is_better(metric)
                    except BaselineError as exc:
                        self.error(metric_node, str(exc))
                        continue
                    tol = self.fraction(tol_node)
                    if tol is not None:
                        tolerances.append((metric, tol))
            elif key == "metrics":
                self.error(
                    value, "'metrics' must map result keys to tolerances, e.g. {p99_ttft: 0.1}"
                )
            else:
                self.error(
                    key_node,
                    f"unknown regression key {key!r} (expected tolerance, metrics)",
                )
        return RegressionPolicy(default, tuple(tolerances), node.start_mark.line + 1)

    def fraction(self, node: yaml.Node) -> float | None:
        text = str(getattr(node, "value", ""))
        percent = text.endswith("%")
        try:
            value = float(text.rstrip("%")) / (100.0 if percent else 1.0)
        except ValueError:
            value = -1.0
        if isinstance(node, yaml.ScalarNode) and 0.0 <= value < 10.0:
            return value
        self.error(node, f"tolerance must be a fraction like 0.05 or '5%', got {_show(node)}")
        return None


def _key(node: yaml.Node) -> str:
    """A mapping key as text; a list or mapping used as a key becomes a name no rule knows."""
    return str(node.value) if isinstance(node, yaml.ScalarNode) else f"<{_show(node)}>"


def _show(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        return repr(node.value)
    return "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
