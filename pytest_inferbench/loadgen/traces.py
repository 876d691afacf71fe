"""Agentic-coding traces (the Weka v1 `traces.jsonl` format InferenceX replays) -> frozen objects.

One JSON object per line, one trace (a recorded coding session) each: top-level requests and
subagent entries that hold their own requests. There is no text in a trace, only lengths, the
prompt's 64-token KV-block hashes, timing, stop reasons and content tags. Validation is strict
like the replayer's (unknown keys are errors, a `null` counts as absent) and every problem of the
file comes back at once, one `path:line: where: problem (expected ...)` each.
`trace_sessions.sessions()` turns a trace into the streams a replay plays.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

TRACES_FILE = "traces.jsonl"
# Per-field problems past this many are summarized: a wrong file need not print every line.
MAX_PROBLEMS = 50

REQUEST_KEYS = ("t", "type", "model", "in", "out", "hash_ids", "input_types", "output_types",
                "stop", "api_time", "think_time", "ttft")
SUBAGENT_KEYS = ("t", "type", "agent_id", "subagent_type", "duration_ms", "total_tokens",
                 "tool_use_count", "status", "requests", "models", "tool_tokens", "system_tokens")
TRACE_KEYS = ("id", "models", "block_size", "hash_id_scope", "tool_tokens", "system_tokens",
              "requests", "totals")


class TraceError(Exception):
    """Every problem of one traces file, one `path:line: ...` line each."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


@dataclass(frozen=True)
class TraceRequest:
    """One recorded request: `in` prompt tokens over `hash_ids` blocks, `out` output tokens."""

    t: float  # start, seconds from the trace's start (nested requests too)
    streaming: bool  # recorded type `s` (`n`: not streamed); a replay always streams
    model: str
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()
    input_types: tuple[str, ...] = ()
    output_types: tuple[str, ...] = ()
    stop: str = ""
    api_time: float | None = None  # recorded server duration, seconds
    think_time: float | None = None
    ttft: float | None = None

    @property
    def end(self) -> float:
        return self.t + (self.api_time or 0.0)


@dataclass(frozen=True)
class Subagent:
    """A subagent entry: its own requests, spawned between two top-level requests."""

    t: float
    agent_id: str
    subagent_type: str
    status: str
    requests: tuple[TraceRequest, ...]
    models: tuple[str, ...]
    position: int  # its index in the trace's `requests` list
    duration_ms: int | None = None
    total_tokens: int | None = None
    tool_use_count: int | None = None
    tool_tokens: int = 0
    system_tokens: int = 0

    @property
    def end(self) -> float:
        if self.duration_ms is not None:
            return self.t + self.duration_ms / 1000
        return max((r.end for r in self.requests), default=self.t)


@dataclass(frozen=True)
class Trace:
    """One session: top-level requests and subagents in recorded order."""

    id: str
    models: tuple[str, ...]
    block_size: int
    entries: tuple[TraceRequest | Subagent, ...]
    line: int  # the line of traces.jsonl it was read from
    tool_tokens: int = 0
    system_tokens: int = 0
    totals: str | None = None  # opaque; kept as its JSON text

    @property
    def turns(self) -> tuple[TraceRequest, ...]:
        return tuple(e for e in self.entries if isinstance(e, TraceRequest))

    @property
    def subagents(self) -> tuple[Subagent, ...]:
        return tuple(e for e in self.entries if isinstance(e, Subagent))

    @property
    def peak_context(self) -> int:
        """The largest `in + out` of any request, nested ones included."""
        return max((r.input_length + r.output_length for _, r in all_requests(self)), default=0)


def load_traces(path: Path) -> tuple[Trace, ...]:
    """The traces of a `traces.jsonl` file, or of the one in a directory. Raises TraceError."""
    file = path / TRACES_FILE if path.is_dir() else path
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise TraceError([f"{file}: cannot read ({exc.strerror or exc})"]) from None
    problems: list[str] = []
    traces: list[Trace] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"{file}:{number}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                            f"{exc.start + 1})")
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            problems.append(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})")
            continue
        reader = _Reader(where)
        trace = reader.trace(obj, number)
        problems.extend(reader.problems)
        if trace is None:
            continue
        if trace.id in seen:
            problems.append(f"{where}: id: duplicate trace id {trace.id!r} (first at line "
                            f"{seen[trace.id]})")
            continue
        seen[trace.id] = number
        traces.append(trace)
    if not traces and not problems:
        problems.append(f"{file}: no traces (expected one JSON object per line)")
    if problems:
        extra = len(problems) - MAX_PROBLEMS
        raise TraceError(problems[:MAX_PROBLEMS]
                         + ([f"{file}: ... and {extra} more problems"] if extra > 0 else []))
    return tuple(traces)


class _Reader:
    """Strict field checks of one line's object, recording problems instead of raising."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.problems: list[str] = []

    def add(self, path: str, problem: str) -> None:
        self.problems.append(f"{self.where}: {path}: {problem}")

    def fields(self, obj: object, path: str, allowed: tuple[str, ...],
               required: tuple[str, ...]) -> dict[str, Any] | None:
        if not isinstance(obj, dict):
            self.add(path, f"got {_kind(obj)} (expected an object)")
            return None
        # The published corpus's Arrow export fills absent keys with null: null is absent.
        present = {k: v for k, v in obj.items() if v is not None}
        ok = True
        for key in present:
            if key not in allowed:
                self.add(f"{path}.{key}", f"unknown key (expected one of: {', '.join(allowed)})")
                ok = False
        for key in required:
            if key not in present:
                self.add(f"{path}.{key}", "missing required key")
                ok = False
        return present if ok else None

    def value(self, f: dict[str, Any], key: str, path: str, kind: str, default: Any = None
              ) -> Any:
        if key not in f:
            return default
        v = f[key]
        good = {
            "str": isinstance(v, str),
            "int": isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            "number": isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v) and v >= 0,
            "ints": isinstance(v, list) and all(
                isinstance(x, int) and not isinstance(x, bool) for x in v),
            "strs": isinstance(v, list) and all(isinstance(x, str) for x in v),
        }[kind]
        if not good:
            expected = {"str": "a string", "int": "an integer >= 0",
                        "number": "a number >= 0", "ints": "a list of integers",
                        "strs": "a list of strings"}[kind]
            self.add(f"{path}.{key}", f"got {_kind(v)} {v!r:.40} (expected {expected})")
            return None
        if kind in ("ints", "strs"):
            return tuple(v)
        return float(v) if kind == "number" else v

    def request(self, obj: object, path: str) -> TraceRequest | None:
        f = self.fields(obj, path, REQUEST_KEYS, ("t", "type", "model", "in", "out"))
        if f is None:
            return None
        before = len(self.problems)
        kind = f["type"]
        if kind not in ("n", "s"):
            self.add(f"{path}.type", f"got {kind!r} (expected 'n' or 's')")
        elif kind == "n" and "ttft" in f:
            self.add(f"{path}.ttft", "only valid on a streamed ('s') request")
        values = {
            "t": self.value(f, "t", path, "number"),
            "model": self.value(f, "model", path, "str"),
            "input_length": self.value(f, "in", path, "int"),
            "output_length": self.value(f, "out", path, "int"),
            "hash_ids": self.value(f, "hash_ids", path, "ints", ()),
            "input_types": self.value(f, "input_types", path, "strs", ()),
            "output_types": self.value(f, "output_types", path, "strs", ()),
            "stop": self.value(f, "stop", path, "str", ""),
            "api_time": self.value(f, "api_time", path, "number"),
            "think_time": self.value(f, "think_time", path, "number"),
            "ttft": self.value(f, "ttft", path, "number"),
        }
        if len(self.problems) > before:
            return None
        return TraceRequest(streaming=kind == "s", **values)

    def subagent(self, obj: dict[str, Any], path: str, position: int) -> Subagent | None:
        f = self.fields(obj, path, SUBAGENT_KEYS,
                        ("t", "type", "agent_id", "subagent_type", "status", "requests", "models"))
        if f is None:
            return None
        before = len(self.problems)
        requests = self.requests(f["requests"], f"{path}.requests", nested=True)
        values = {
            "t": self.value(f, "t", path, "number"),
            "agent_id": self.value(f, "agent_id", path, "str"),
            "subagent_type": self.value(f, "subagent_type", path, "str"),
            "status": self.value(f, "status", path, "str"),
            "models": self.value(f, "models", path, "strs"),
            "duration_ms": self.value(f, "duration_ms", path, "int"),
            "total_tokens": self.value(f, "total_tokens", path, "int"),
            "tool_use_count": self.value(f, "tool_use_count", path, "int"),
            "tool_tokens": self.value(f, "tool_tokens", path, "int", 0),
            "system_tokens": self.value(f, "system_tokens", path, "int", 0),
        }
        if len(self.problems) > before or requests is None:
            return None
        # Nested times are absolute in the published corpora; one before its subagent's own `t`
        # is the older relative convention and is read as an offset from it.
        start = values["t"]
        inner = tuple(r if r.t >= start else replace(r, t=start + r.t)
                      for r in requests if isinstance(r, TraceRequest))
        return Subagent(requests=inner, position=position, **values)

    def requests(self, obj: object, path: str, *, nested: bool
                 ) -> list[TraceRequest | Subagent] | None:
        if not isinstance(obj, list):
            self.add(path, f"got {_kind(obj)} (expected a list)")
            return None
        out: list[TraceRequest | Subagent] = []
        for i, item in enumerate(obj):
            where = f"{path}[{i}]"
            entry: TraceRequest | Subagent | None
            if isinstance(item, dict) and item.get("type") == "subagent":
                if nested:
                    self.add(f"{where}.type", "a subagent inside a subagent (expected 'n' or "
                             "'s')")
                    continue
                entry = self.subagent(item, where, i)
            else:
                entry = self.request(item, where)
            if entry is not None:
                out.append(entry)
        return out

    def trace(self, obj: object, line: int) -> Trace | None:
        f = self.fields(obj, "<trace>", TRACE_KEYS,
                        ("id", "models", "block_size", "hash_id_scope", "requests"))
        if f is None:
            return None
        before = len(self.problems)
        if f["hash_id_scope"] != "local":
            self.add("hash_id_scope", f"got {f['hash_id_scope']!r} (expected 'local')")
        block_size = self.value(f, "block_size", "<trace>", "int")
        if block_size == 0:
            self.add("block_size", "got 0 (expected an integer > 0)")
        trace_id = self.value(f, "id", "<trace>", "str")
        models = self.value(f, "models", "<trace>", "strs")
        tool = self.value(f, "tool_tokens", "<trace>", "int", 0)
        system = self.value(f, "system_tokens", "<trace>", "int", 0)
        if "totals" in f and not isinstance(f["totals"], dict):
            self.add("totals", f"got {_kind(f['totals'])} (expected an object)")
        entries = self.requests(f["requests"], "requests", nested=False)
        if entries is not None:
            names = [s.agent_id for s in entries if isinstance(s, Subagent)]
            for name in sorted({n for n in names if names.count(n) > 1}):
                self.add("requests", f"subagent agent_id {name!r} given more than once")
        if len(self.problems) > before or entries is None:
            return None
        totals = json.dumps(f["totals"], sort_keys=True) if "totals" in f else None
        return Trace(id=trace_id, models=models, block_size=block_size, entries=tuple(entries),
                     line=line, tool_tokens=tool, system_tokens=system, totals=totals)


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), type(value).__name__)


def all_requests(trace: Trace) -> list[tuple[tuple[str, int], TraceRequest]]:
    """Every request as ((session id, turn index), request)."""
    out = [((trace.id, k), r) for k, r in enumerate(trace.turns)]
    for sub in trace.subagents:
        out += [((child_session(trace, sub), k), r) for k, r in enumerate(sub.requests)]
    return out


def child_session(trace: Trace, subagent: Subagent) -> str:
    """A subagent's session id, as the replayer names it."""
    return f"{trace.id}::sa:{subagent.agent_id}"


def shared_prefix_blocks(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading block hashes two requests share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
