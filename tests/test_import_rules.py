"""The package's import graph: no circles, and each part imports only what docs/architecture.md
says it may. Every import counts, also those under TYPE_CHECKING and inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_inferbench"
ROOT = "pytest_inferbench"

# The floors of docs/architecture.md ("Layout"), lowest first: a part may import only parts on
# floors below its own. A module belongs to the longest part its name starts with; imports within
# a part are free.
FLOORS: list[set[str]] = [
    {"util", "frameworks"},
    {"recipe"},
    {"results"},
    {"loadgen"},
    {"sim"},
    {"sim.server"},
    {"options"},
    {"backends"},
    {"state"},
    {"gates", "changelog"},
    {"evals"},
    {"report"},
    {"plugin"},
    {ROOT, "fixtures"},
    {"testing"},
]
# Part -> the parts it may import: the edges docs/architecture.md draws, each one downward.
MAY_IMPORT: dict[str, set[str]] = {
    "util": set(),
    "frameworks": set(),
    "recipe": {"frameworks", "util"},
    "results": {"frameworks", "recipe", "util"},
    "loadgen": {"frameworks", "recipe", "results", "util"},
    "sim": {"frameworks", "loadgen", "recipe", "results", "util"},
    "sim.server": {"frameworks", "loadgen", "sim", "util"},
    "options": {"loadgen", "recipe", "results"},
    "backends": {"loadgen", "options", "recipe", "results", "sim", "util"},
    "state": {"backends", "options", "results"},
    "gates": {"frameworks", "options", "recipe", "results", "util"},
    "changelog": {"options", "recipe", "state", "util"},
    "evals": {"backends", "frameworks", "options", "recipe", "results", "sim", "state",
              "util"},
    "report": {"gates", "loadgen", "options", "results", "state"},
    "plugin": {"backends", "changelog", "evals", "gates", "loadgen", "options", "recipe",
               "report", "results", "state"},
    ROOT: {"evals", "plugin"},
    "fixtures": {"evals", "plugin"},
    "testing": {"backends", "frameworks", "recipe", ROOT},
}
# What may sit at the package root besides the parts' packages: the public face, the old import
# path of the fixture types, and the session state that every floor from `state` up shares.
ROOT_MODULES = {"__init__.py", "fixtures.py", "state.py"}
# `python -m pytest_inferbench.sim` starts the server: the entry point belongs to it.
PART_OF = {"sim.__main__": "sim.server"}
# The engine core has no I/O and no clock (docs/simulator.md).
ENGINE_CORE = ("sim.config", "sim.engine", "sim.physics", "sim.pipeline", "sim.acceptance",
               "sim.state",
               "sim.kv_blocks", "sim.prefix_cache", "sim.host_cache", "sim.offload_args",
               "sim.stretch", "sim.closed_loop", "sim.kv_schedule", "sim.planned",
               "sim.decode_sums", "sim.driver", "sim.disagg", "sim.cluster", "sim.instance",
               "sim.cluster_driver", "sim.cluster_replay", "sim.replay_driver", "sim.efficiency",
               # The agentic replay's schedule: the simulator runs it on its virtual clock.
               "loadgen.replay_schedule", "loadgen.replay_warmup", "loadgen.replay_lanes",
               "loadgen.replay_start", "loadgen.replay_config", "loadgen.trace_sessions")
NO_IO_OR_CLOCK = {"asyncio", "httpx", "os", "socket", "subprocess", "threading", "time"}


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts) or ROOT] = path
    return names


def imports_of(name: str, path: Path, modules: set[str]) -> tuple[set[str], set[str]]:
    """(package modules, outside top-level modules) that `name` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside: set[str] = set()
    outside: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                    inside.add(alias.name.removeprefix(ROOT + ".") if alias.name != ROOT else ROOT)
                else:
                    outside.add(alias.name.partition(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                module = node.module or ""
                if module != ROOT and not module.startswith(ROOT + "."):
                    outside.add(module.partition(".")[0])
                    continue
                base = "" if module == ROOT else module.removeprefix(ROOT + ".")
            else:
                up = package.split(".") if package not in ("", ROOT) else []
                up = up[: len(up) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            submodules = {f"{base}.{a.name}" if base else a.name for a in node.names}
            found = submodules & modules
            inside |= found or {base or ROOT}
    inside.discard(name)
    return inside, outside


def graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, set(modules))[0] for name, path in modules.items()}


def part_of(module: str) -> str:
    if module in PART_OF:
        return PART_OF[module]
    candidates = [p for p in MAY_IMPORT if module == p or module.startswith(p + ".")]
    return max(candidates, key=len) if candidates else ROOT


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    assert cycles(graph()) == []


def test_every_part_imports_only_what_it_may() -> None:
    broken = []
    for module, targets in sorted(graph().items()):
        part = part_of(module)
        allowed = MAY_IMPORT[part]
        for target in sorted(targets):
            other = part_of(target)
            if other != part and not any(other == a or other.startswith(a + ".")
                                         for a in allowed):
                broken.append(f"{module} -> {target} ({part} may not import {other})")
    assert broken == []


def test_the_engine_core_has_no_io_and_no_clock() -> None:
    modules = module_names()
    for name in ENGINE_CORE:
        _, outside = imports_of(name, modules[name], set(modules))
        assert not outside & NO_IO_OR_CLOCK, (name, outside & NO_IO_OR_CLOCK)


def test_the_graph_sees_relative_typing_and_function_level_imports() -> None:
    edges = graph()
    assert "sim.engine" in edges["sim.driver"]  # `from .engine import Engine`
    assert "recipe.launch" in edges["gates.speculative"]  # under TYPE_CHECKING
    assert "evals.item" in edges["evals.collect"]  # inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def floor_of(part: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if part in floor)


def test_every_part_stands_on_a_floor_and_its_rules_point_down() -> None:
    assert {p for floor in FLOORS for p in floor} == set(MAY_IMPORT)
    upward = [f"{part} -> {other}" for part, allowed in MAY_IMPORT.items() for other in allowed
              if floor_of(other) >= floor_of(part)]
    assert upward == []


def test_the_root_holds_only_the_public_face_and_the_session_state() -> None:
    modules = {p.name for p in PACKAGE.glob("*.py")}
    assert modules == ROOT_MODULES
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == {p for p in MAY_IMPORT if "." not in p and p != ROOT} - {"fixtures", "state"}
