"""Validate an InferenceX master config into `recipe` objects, with file:line errors.

Every problem is reported as `path:line: key.path: what is wrong (expected ...)`. The rules are
those of InferenceX's `validation.py` (pydantic, `extra='forbid'`), for both generations of its
schema (the current one adds `pp`, `dcp-size`, `pcp-size`, `router`, `kv-p2p-transfer`,
`kv-offloading`, `recipe-fingerprint`, worker `hardware`): unknown keys are errors, `multinode` is
required, concurrency is a range or a list but not both.

Problems are scoped to the entry (config key) they belong to: a file with one bad entry still
gives every other entry's servers, and the bad entry's problems are listed, all at once, in an
`InvalidEntry`. Only an unreadable file (YAML syntax, not a mapping) fails whole.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import TYPE_CHECKING

from ..util import yamllines
from ..util.yamllines import MappingNode, Node
from . import agentic
from .model import (
    CLUSTER_LABEL_PREFIX,
    GPU_BY_RUNNER_PREFIX,
    InvalidEntry,
    RecipeFile,
    ServerConfig,
    hardware_for_runner,
)
from .rows import EntryContext, Row, group_into_servers, scenarios
from .yaml_walk import Errors, RecipeError, Walker, describe, scalar

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["RecipeError", "load_recipe"]

ENTRY_REQUIRED = ("image", "model", "model-prefix", "runner", "precision", "framework",
                  "multinode", "scenarios")
ENTRY_KEYS = (*ENTRY_REQUIRED, "disagg", "router", "kv-p2p-transfer", "recipe-fingerprint")
FINGERPRINT = re.compile(r"[0-9a-f]{64}")


def load_recipe(path: Path, *, strict: bool = True) -> RecipeFile:
    """Parse and validate one master config.

    strict: raise RecipeError with every problem of the file when any entry is invalid.
    Otherwise return the valid entries' servers and the invalid entries with their problems.
    """
    try:
        root = yamllines.compose(yamllines.read_text(path))
    except yamllines.YamlSyntaxError as exc:
        raise RecipeError([f"{path}:{exc.line}: YAML syntax error: {exc.problem}"]) from None
    errors = Errors(path)
    if root is None:
        return RecipeFile(path=path, servers=())
    if not isinstance(root, MappingNode):
        errors.add(root, "<top level>", f"got {describe(root)} (expected a mapping of config "
                   "keys to entries)")
        raise RecipeError(errors.messages)
    walker = Walker(errors)
    runners = agentic.read_runner_table(path)
    servers: list[ServerConfig] = []
    invalid: list[InvalidEntry] = []
    seen_keys: dict[str, int] = {}
    for key_node, entry_node in root.value:
        key = str(scalar(key_node))
        line = key_node.start_mark.line + 1
        first_problem = len(errors.messages)
        entry_servers: list[ServerConfig] = []
        if key in seen_keys:
            errors.add(key_node, key, f"duplicate config key (first defined at line "
                       f"{seen_keys[key]})")
        else:
            seen_keys[key] = line
            if "*" in key:
                errors.add(key_node, key, "'*' is reserved for changelog wildcards (expected a "
                           "config key without '*')")
            entry_servers = _entry(walker, key, key_node, entry_node, runners)
        problems = errors.messages[first_problem:]
        if problems:
            invalid.append(InvalidEntry(config_key=key, line=line, problems=tuple(problems)))
        else:
            servers.extend(entry_servers)
    if strict and errors.messages:
        raise RecipeError(errors.messages)
    return RecipeFile(path=path, servers=tuple(servers), invalid_entries=tuple(invalid))


def _entry(w: Walker, key: str, key_node: Node, node: Node,
           runners: agentic.RunnerTable) -> list[ServerConfig]:
    fields = w.mapping(node, key, ENTRY_KEYS, ENTRY_REQUIRED)
    if fields is None:
        return []
    names = ("image", "model", "model-prefix", "runner", "precision", "framework")
    text = {name: w.string(fields[name], f"{key}.{name}") for name in names if name in fields}
    multinode = (w.boolean(fields["multinode"], f"{key}.multinode")
                 if "multinode" in fields else None)
    disagg = w.boolean(fields["disagg"], f"{key}.disagg") if "disagg" in fields else False
    router = (w.component(fields["router"], f"{key}.router", version_required=True)
              if "router" in fields else None)
    transfer = None
    if "kv-p2p-transfer" in fields:
        transfer = w.string(fields["kv-p2p-transfer"], f"{key}.kv-p2p-transfer")
        if multinode is False:
            w.errors.add(fields["kv-p2p-transfer"], f"{key}.kv-p2p-transfer",
                         "only valid when multinode is true")
    if "recipe-fingerprint" in fields:
        _fingerprint(w, fields["recipe-fingerprint"], f"{key}.recipe-fingerprint")
    runner = text.get("runner")
    hardware = hardware_for_runner(runner) if runner else None
    if runner and hardware is None:
        w.errors.add(fields["runner"], f"{key}.runner", f"unknown runner {runner!r} (expected a "
                     f"name starting with one of: {', '.join(sorted(GPU_BY_RUNNER_PREFIX))}, "
                     "optionally after 'cluster:')")
    context = EntryContext(key=key, multinode=bool(multinode), router=router,
                           kv_p2p_transfer=transfer)
    rows = scenarios(w, fields["scenarios"], context) if "scenarios" in fields else []
    if any(r.current_offloading for r in rows) and not _agentic_entry_rules(
            w, key, fields, runner, disagg, rows):
        return []
    given = {name: value for name, value in text.items() if value is not None}
    if (len(given) < len(names) or multinode is None or disagg is None or hardware is None
            or not rows):
        return []
    entry = functools.partial(
        ServerConfig, config_key=key, image=given["image"], model=given["model"],
        model_prefix=given["model-prefix"], runner=given["runner"], hardware=hardware,
        precision=given["precision"], framework=given["framework"], multinode=multinode,
        disagg=disagg, source=w.errors.path, line=key_node.start_mark.line + 1)
    return [_with_dram_budget(w, key, key_node, server, runners)
            for server in group_into_servers(entry, rows)]


def _agentic_entry_rules(w: Walker, key: str, fields: dict[str, Node], runner: str | None,
                         disagg: bool | None, rows: list[Row]) -> bool:
    """The entry-wide rules of the current agentic schema: a cluster runner, and a disaggregated
    entry's kv-p2p-transfer on the entry or on every row. False when one is broken."""
    ok = True
    problem = agentic.cluster_runner_problem(runner, CLUSTER_LABEL_PREFIX) if runner else None
    if problem:
        w.errors.add(fields["runner"], f"{key}.runner", problem)
        ok = False
    if disagg and any(r.shape.kv_p2p_transfer is None for r in rows):
        w.errors.add(fields["disagg"], f"{key}.disagg", "disaggregated without kv-p2p-transfer "
                     "(expected kv-p2p-transfer on the entry or on every search-space row)")
        ok = False
    return ok


def _with_dram_budget(w: Walker, key: str, key_node: Node, server: ServerConfig,
                      runners: agentic.RunnerTable) -> ServerConfig:
    """An agentic server with InferenceX's `total-cpu-dram-gb` (None when there is no
    runners.yaml beside the recipe to size a DRAM budget from)."""
    if server.scenario != agentic.SCENARIO:
        return server
    if server.offloading != "dram":
        return dataclasses.replace(server, total_cpu_dram_gb=0)
    if not runners.found:
        return server
    hardware = runners.hardware.get(server.runner)
    if runners.problem or hardware is None:
        w.errors.add(key_node, f"{key}.runner", f"{runners.problem or 'no hardware row for '}"
                     f"{'' if runners.problem else repr(server.runner)} in {runners.path} "
                     "(expected available-cpu-dram-mib and gpus-per-node for the runner of a "
                     "dram-offloading agentic entry)")
        return server
    try:
        return dataclasses.replace(server,
                                   total_cpu_dram_gb=agentic.total_cpu_dram_gb(server, hardware))
    except ValueError as exc:
        w.errors.add(key_node, key, f"{exc} (expected a topology that fits the runner's nodes "
                     "to size its DRAM budget)")
        return server


def _fingerprint(w: Walker, node: Node, where: str) -> None:
    value = w.string(node, where)
    if value is not None and not FINGERPRINT.fullmatch(value):
        w.errors.add(node, where, f"got {value!r} (expected 64 lowercase hex digits)")
