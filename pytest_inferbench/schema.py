"""Validate an InferenceX master config into `recipe` objects, with file:line errors.

The YAML is composed into nodes (which carry their line marks) and walked by hand, so every
problem is reported as `path:line: key.path: what is wrong (expected ...)`. The rules are those of
InferenceX's `validation.py` (pydantic, `extra='forbid'`): unknown keys are errors, `multinode`
is required, concurrency is a range or a list but not both. All errors of a file are reported at
once; one bad entry does not hide another's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from . import yamllines
from .recipe import (
    GPU_BY_RUNNER_PREFIX,
    SPEC_DECODING_VALUES,
    RecipeFile,
    SeqLenSweep,
    ServerConfig,
    expand_concurrency,
    hardware_for_runner,
)

if TYPE_CHECKING:
    from pathlib import Path

ENTRY_REQUIRED = ("image", "model", "model-prefix", "runner", "precision", "framework",
                  "multinode", "scenarios")
ENTRY_KEYS = (*ENTRY_REQUIRED, "disagg")
CONC_KEYS = ("conc-start", "conc-end", "conc-list")
SINGLE_NODE_KEYS = ("tp", "ep", "dp-attn", "spec-decoding", *CONC_KEYS)
MULTI_NODE_KEYS = ("spec-decoding", "prefill", "decode", *CONC_KEYS)
AGENTIC_KEYS = ("tp", "ep", "dp-attn", "spec-decoding", "prefill", "decode", "offloading",
                *CONC_KEYS)
WORKER_KEYS = ("num-worker", "tp", "ep", "dp-attn", "additional-settings")
OFFLOADING_VALUES = ("none", "cpu", "ssd", "lmcache", "lmcache-mp", "hicache")


class RecipeError(Exception):
    """All problems of one recipe file, one `path:line: ...` line each."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


@dataclass
class _Errors:
    path: Path
    messages: list[str] = field(default_factory=list)

    def add(self, node: Node, key_path: str, problem: str) -> None:
        self.messages.append(f"{self.path}:{node.start_mark.line + 1}: {key_path}: {problem}")


_scalar = yamllines.scalar
_describe = yamllines.describe


class _Walker:
    """Typed accessors over YAML nodes that record errors instead of raising."""

    def __init__(self, errors: _Errors) -> None:
        self.errors = errors

    def mapping(self, node: Node, where: str, allowed: tuple[str, ...],
                required: tuple[str, ...] = ()) -> dict[str, Node] | None:
        if not isinstance(node, MappingNode):
            self.errors.add(node, where, f"got {_describe(node)} (expected a mapping)")
            return None
        out: dict[str, Node] = {}
        for key_node, value_node in node.value:
            key = str(_scalar(key_node)) if isinstance(key_node, ScalarNode) else "?"
            if key in out:
                self.errors.add(key_node, f"{where}.{key}", "duplicate key")
                continue
            if key not in allowed:
                self.errors.add(key_node, f"{where}.{key}",
                                f"unknown key (expected one of: {', '.join(allowed)})")
                continue
            out[key] = value_node
        for key in required:
            if key not in out:
                self.errors.add(node, f"{where}.{key}", "missing required key")
        return out

    def sequence(self, node: Node, where: str) -> list[Node] | None:
        if not isinstance(node, SequenceNode):
            self.errors.add(node, where, f"got {_describe(node)} (expected a list)")
            return None
        return list(node.value)

    def string(self, node: Node, where: str) -> str | None:
        value = _scalar(node) if isinstance(node, ScalarNode) else None
        if not isinstance(value, str) or not value:
            self.errors.add(node, where, f"got {_describe(node)} (expected a non-empty string)")
            return None
        return value

    def integer(self, node: Node, where: str, minimum: int | None = 1) -> int | None:
        value = _scalar(node) if isinstance(node, ScalarNode) else None
        if not isinstance(value, int) or isinstance(value, bool):
            self.errors.add(node, where, f"got {_describe(node)} (expected an integer)")
            return None
        if minimum is not None and value < minimum:
            self.errors.add(node, where, f"got {value} (expected an integer >= {minimum})")
            return None
        return value

    def boolean(self, node: Node, where: str) -> bool | None:
        value = _scalar(node) if isinstance(node, ScalarNode) else None
        if not isinstance(value, bool):
            self.errors.add(node, where, f"got {_describe(node)} (expected true or false)")
            return None
        return value

    def choice(self, node: Node, where: str, choices: tuple[str, ...]) -> str | None:
        value = _scalar(node) if isinstance(node, ScalarNode) else None
        if value not in choices:
            self.errors.add(node, where,
                            f"got {_describe(node)} (expected one of: {', '.join(choices)})")
            return None
        return str(value)

    def concurrencies(self, node: Node, fields: dict[str, Node], where: str
                      ) -> tuple[int, ...] | None:
        has_range = "conc-start" in fields or "conc-end" in fields
        if has_range and "conc-list" in fields:
            self.errors.add(node, where, "both 'conc-list' and 'conc-start'/'conc-end' given "
                            "(expected either a list or a range, not both)")
            return None
        if "conc-list" in fields:
            items = self.sequence(fields["conc-list"], f"{where}.conc-list")
            if items is None:
                return None
            if not items:
                self.errors.add(fields["conc-list"], f"{where}.conc-list",
                                "empty list (expected at least one concurrency)")
                return None
            values = [self.integer(item, f"{where}.conc-list[{i}]") for i, item in enumerate(items)]
            return None if None in values else tuple(v for v in values if v is not None)
        if "conc-start" not in fields or "conc-end" not in fields:
            self.errors.add(node, where, "no concurrency (expected 'conc-list' or both "
                            "'conc-start' and 'conc-end')")
            return None
        start = self.integer(fields["conc-start"], f"{where}.conc-start")
        end = self.integer(fields["conc-end"], f"{where}.conc-end")
        if start is None or end is None:
            return None
        if start > end:
            self.errors.add(fields["conc-start"], f"{where}.conc-start",
                            f"conc-start ({start}) > conc-end ({end}) (expected start <= end)")
            return None
        return expand_concurrency(start, end)


def load_recipe(path: Path) -> RecipeFile:
    """Parse and validate one master config; raise RecipeError with every problem found."""
    text = path.read_text(encoding="utf-8")
    try:
        root = yamllines.compose(text)
    except yamllines.YamlSyntaxError as exc:
        raise RecipeError([f"{path}:{exc.line}: YAML syntax error: {exc.problem}"]) from None
    errors = _Errors(path)
    if root is None:
        return RecipeFile(path=path, servers=())
    walker = _Walker(errors)
    if not isinstance(root, MappingNode):
        errors.add(root, "<top level>", f"got {_describe(root)} (expected a mapping of config "
                   "keys to entries)")
        raise RecipeError(errors.messages)
    servers: list[ServerConfig] = []
    seen_keys: dict[str, int] = {}
    for key_node, entry_node in root.value:
        key = str(_scalar(key_node))
        line = key_node.start_mark.line + 1
        if key in seen_keys:
            errors.add(key_node, key, f"duplicate config key (first defined at line "
                       f"{seen_keys[key]})")
            continue
        seen_keys[key] = line
        if "*" in key:
            errors.add(key_node, key, "'*' is reserved for changelog wildcards (expected a "
                       "config key without '*')")
        servers.extend(_entry(walker, key, key_node, entry_node))
    _check_unique_nodes(servers, errors)
    if errors.messages:
        raise RecipeError(errors.messages)
    return RecipeFile(path=path, servers=tuple(servers))


def _entry(w: _Walker, key: str, key_node: Node, node: Node) -> list[ServerConfig]:
    fields = w.mapping(node, key, ENTRY_KEYS, ENTRY_REQUIRED)
    if fields is None:
        return []
    names = ("image", "model", "model-prefix", "runner", "precision", "framework")
    text = {name: w.string(fields[name], f"{key}.{name}") for name in names if name in fields}
    multinode = (w.boolean(fields["multinode"], f"{key}.multinode")
                 if "multinode" in fields else None)
    disagg = w.boolean(fields["disagg"], f"{key}.disagg") if "disagg" in fields else False
    runner = text.get("runner")
    hardware = hardware_for_runner(runner) if runner else None
    if runner and hardware is None:
        w.errors.add(fields["runner"], f"{key}.runner", f"unknown runner {runner!r} (expected a "
                     f"name starting with one of: {', '.join(sorted(GPU_BY_RUNNER_PREFIX))})")
    scenarios = fields.get("scenarios")
    rows = _scenarios(w, key, scenarios, multinode) if scenarios is not None else []
    if (None in text.values() or len(text) < 6 or multinode is None or disagg is None
            or hardware is None or not rows):
        return []
    base = {
        "config_key": key, "image": text["image"], "model": text["model"],
        "model_prefix": text["model-prefix"], "runner": text["runner"], "hardware": hardware,
        "precision": text["precision"], "framework": text["framework"], "multinode": multinode,
        "disagg": disagg, "source": w.errors.path, "line": key_node.start_mark.line + 1,
    }
    return _group_into_servers(base, rows)


@dataclass(frozen=True)
class _Row:
    """One validated search-space row before grouping into server nodes."""

    scenario: str
    tp: int
    ep: int
    dp_attn: bool
    spec_decoding: str
    isl: int
    osl: int
    concurrencies: tuple[int, ...]
    line: int
    topology: str = ""
    skip_reason: str | None = None


def _scenarios(w: _Walker, key: str, node: Node, multinode: bool | None) -> list[_Row]:
    fields = w.mapping(node, f"{key}.scenarios", ("fixed-seq-len", "agentic-coding"))
    if fields is None:
        return []
    if not fields:
        w.errors.add(node, f"{key}.scenarios", "no scenario (expected 'fixed-seq-len' and/or "
                     "'agentic-coding')")
        return []
    rows: list[_Row] = []
    for scenario, scen_node in fields.items():
        where = f"{key}.scenarios.{scenario}"
        items = w.sequence(scen_node, where)
        if items is None:
            continue
        if not items:
            w.errors.add(scen_node, where, "empty list (expected at least one entry)")
        for i, item in enumerate(items):
            rows.extend(_scenario_item(w, f"{where}[{i}]", scenario, item, multinode))
    return rows


def _scenario_item(w: _Walker, where: str, scenario: str, node: Node,
                   multinode: bool | None) -> list[_Row]:
    if scenario == "fixed-seq-len":
        fields = w.mapping(node, where, ("isl", "osl", "search-space"),
                           ("isl", "osl", "search-space"))
    else:
        fields = w.mapping(node, where, ("duration", "search-space"), ("search-space",))
    if fields is None or "search-space" not in fields:
        return []
    isl = w.integer(fields["isl"], f"{where}.isl") if "isl" in fields else 0
    osl = w.integer(fields["osl"], f"{where}.osl") if "osl" in fields else 0
    if "duration" in fields:
        w.integer(fields["duration"], f"{where}.duration")
    space = w.sequence(fields["search-space"], f"{where}.search-space")
    if space is None:
        return []
    if not space:
        w.errors.add(fields["search-space"], f"{where}.search-space",
                     "empty search-space (expected at least one row)")
        return []
    rows = []
    for j, row_node in enumerate(space):
        row = _search_row(w, f"{where}.search-space[{j}]", scenario, row_node, multinode)
        if row is not None and isl is not None and osl is not None:
            rows.append(_Row(**{**row.__dict__, "isl": isl, "osl": osl}))
    return rows


def _search_row(w: _Walker, where: str, scenario: str, node: Node,
                multinode: bool | None) -> _Row | None:
    agentic = scenario == "agentic-coding"
    allowed = AGENTIC_KEYS if agentic else MULTI_NODE_KEYS if multinode else SINGLE_NODE_KEYS
    required: tuple[str, ...] = () if agentic else ("prefill", "decode") if multinode else ("tp",)
    f = w.mapping(node, where, allowed, required)
    if f is None:
        return None
    spec = (w.choice(f["spec-decoding"], f"{where}.spec-decoding", SPEC_DECODING_VALUES)
            if "spec-decoding" in f else "none")
    concs = w.concurrencies(node, f, where)
    line = node.start_mark.line + 1
    if "offloading" in f:
        w.choice(f["offloading"], f"{where}.offloading", OFFLOADING_VALUES)
    if "prefill" in f or "decode" in f:
        if agentic and "tp" in f:
            w.errors.add(node, where, "both tp and prefill/decode given (expected either tp or "
                         "both prefill and decode)")
            return None
        prefill = _worker(w, f.get("prefill"), node, f"{where}.prefill")
        decode = _worker(w, f.get("decode"), node, f"{where}.decode")
        if prefill is None or decode is None or spec is None or concs is None:
            return None
        kind = "agentic-coding" if agentic else "multinode"
        return _Row(scenario=scenario, tp=decode[1], ep=decode[2], dp_attn=decode[3],
                    spec_decoding=spec, isl=0, osl=0, concurrencies=concs, line=line,
                    topology=f"-p{prefill[0]}x{prefill[1]}-d{decode[0]}x{decode[1]}",
                    skip_reason=f"{kind}: not supported yet")
    if agentic and "tp" not in f:
        w.errors.add(node, where, "no topology (expected either tp or both prefill and decode)")
        return None
    tp = w.integer(f["tp"], f"{where}.tp") if "tp" in f else None
    ep = w.integer(f["ep"], f"{where}.ep") if "ep" in f else 1
    dpa = w.boolean(f["dp-attn"], f"{where}.dp-attn") if "dp-attn" in f else False
    if None in (tp, ep, dpa, spec, concs):
        return None
    assert tp is not None and ep is not None and dpa is not None and spec and concs
    return _Row(scenario=scenario, tp=tp, ep=ep, dp_attn=dpa, spec_decoding=spec, isl=0, osl=0,
                concurrencies=concs, line=line,
                skip_reason="agentic-coding: not supported yet" if agentic else None)


def _worker(w: _Walker, node: Node | None, parent: Node, where: str
            ) -> tuple[int, int, int, bool] | None:
    if node is None:
        w.errors.add(parent, where, "missing required key")
        return None
    f = w.mapping(node, where, WORKER_KEYS, ("num-worker", "tp", "ep", "dp-attn"))
    if f is None or len(set(f) & {"num-worker", "tp", "ep", "dp-attn"}) < 4:
        return None
    if "additional-settings" in f:
        for i, item in enumerate(w.sequence(f["additional-settings"],
                                            f"{where}.additional-settings") or []):
            w.string(item, f"{where}.additional-settings[{i}]")
    nw = w.integer(f["num-worker"], f"{where}.num-worker")
    tp = w.integer(f["tp"], f"{where}.tp")
    ep = w.integer(f["ep"], f"{where}.ep")
    dpa = w.boolean(f["dp-attn"], f"{where}.dp-attn")
    if nw is None or tp is None or ep is None or dpa is None:
        return None
    return nw, tp, ep, dpa


def _group_into_servers(base: dict[str, Any], rows: list[_Row]) -> list[ServerConfig]:
    """One server node per distinct server setup; it serves every ISL/OSL of its entry."""
    groups: dict[tuple[object, ...], list[_Row]] = {}
    for row in rows:
        ident = (row.scenario, row.tp, row.ep, row.dp_attn, row.spec_decoding, row.topology)
        groups.setdefault(ident, []).append(row)
    servers = []
    for group in groups.values():
        first = group[0]
        sweeps = tuple(SeqLenSweep(isl=r.isl, osl=r.osl, concurrencies=r.concurrencies,
                                   line=r.line) for r in group)
        servers.append(ServerConfig(
            **base, tp=first.tp, ep=first.ep, dp_attn=first.dp_attn,
            spec_decoding=first.spec_decoding, sweeps=sweeps, scenario=first.scenario,
            topology=first.topology, skip_reason=first.skip_reason))
    return servers


def _check_unique_nodes(servers: list[ServerConfig], errors: _Errors) -> None:
    """Duplicate node ids would collide in JUnit, --lf and result files: reject them."""
    seen: dict[str, ServerConfig] = {}
    for server in servers:
        other = seen.get(server.node_name)
        if other is not None:
            errors.messages.append(
                f"{server.source}:{server.line}: {server.config_key}: duplicate server node "
                f"{server.node_name!r} (first defined at line {other.line})")
            continue
        seen[server.node_name] = server
        names: dict[str, int] = {}
        for point in server.points():
            if point.name in names:
                errors.messages.append(
                    f"{server.source}:{point.line}: {server.config_key}: duplicate point "
                    f"{server.node_name}::{point.name} (first at line {names[point.name]})")
            names.setdefault(point.name, point.line)
