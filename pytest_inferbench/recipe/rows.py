"""Scenarios and search-space rows of a master entry, and how rows become server nodes.

A row describes one server shape (everything that decides how the server is started) and the
concurrencies swept on it. Rows of an entry with the same shape are one server: their points are
merged, and a point two rows both give is kept once (`BenchPoint.repeated_at` says where else).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from yaml.nodes import MappingNode, Node

from .model import SPEC_DECODING_VALUES, Parallelism, SeqLenSweep, ServerConfig, Worker
from .yaml_walk import Walker, scalar

if TYPE_CHECKING:
    from collections.abc import Callable

CONC_KEYS = ("conc-start", "conc-end", "conc-list")
PARALLEL_KEYS = ("pp", "dcp-size", "pcp-size")
COMPONENT_KEYS = ("router", "recipe-fingerprint")
SINGLE_NODE_KEYS = ("tp", "ep", "dp-attn", "spec-decoding", *PARALLEL_KEYS, *COMPONENT_KEYS,
                    *CONC_KEYS)
MULTI_NODE_KEYS = ("spec-decoding", "prefill", "decode", "kv-p2p-transfer", *COMPONENT_KEYS,
                   *CONC_KEYS)
AGENTIC_KEYS = ("tp", "ep", "dp-attn", "spec-decoding", "prefill", "decode", "offloading",
                "kv-offloading", "kv-offload-backend", "kv-p2p-transfer", *PARALLEL_KEYS,
                *COMPONENT_KEYS, *CONC_KEYS)
WORKER_KEYS = ("num-worker", "tp", "ep", "dp-attn", "additional-settings", "hardware",
               *PARALLEL_KEYS)
# `offloading` is the older agentic key; `kv-offloading` (with a backend) replaced it.
OFFLOADING_VALUES = ("none", "cpu", "ssd", "lmcache", "lmcache-mp", "hicache")
KV_OFFLOADING_VALUES = ("none", "dram")
# Parsed and valid, but not run: the backend-specific wording is
# `options.backend_registry.unsupported_reason`.
AGENTIC_SKIP = "agentic-coding: agentic trace replay is not implemented yet"
IMAGE_VERSION = "image:"


@dataclass(frozen=True)
class EntryContext:
    """What a row needs to know about its entry."""

    key: str
    multinode: bool
    router: str | None
    kv_p2p_transfer: str | None


@dataclass(frozen=True)
class Shape:
    """Everything that decides how a server is started: the identity of a server node."""

    scenario: str
    parallel: Parallelism
    spec_decoding: str
    prefill: Worker | None = None
    decode: Worker | None = None
    offloading: str = "none"
    kv_offload_backend: str | None = None
    dram_utilization: float | None = None
    router: str | None = None
    kv_p2p_transfer: str | None = None
    skip_reason: str | None = None


@dataclass(frozen=True)
class Row:
    """One validated search-space row: a shape at one ISL/OSL and its concurrencies."""

    shape: Shape
    isl: int
    osl: int
    concurrencies: tuple[int, ...]
    line: int
    # An agentic row that says `kv-offloading`/`kv-offload-backend`: the current schema, whose
    # entries must name a `cluster:` runner (the older one had neither).
    current_offloading: bool = False


def scenarios(w: Walker, node: Node, entry: EntryContext) -> list[Row]:
    where = f"{entry.key}.scenarios"
    found = w.mapping(node, where, ("fixed-seq-len", "agentic-coding"))
    if found is None:
        return []
    if not found:
        w.errors.add(node, where, "no scenario (expected 'fixed-seq-len' and/or "
                     "'agentic-coding')")
        return []
    rows: list[Row] = []
    for scenario, scen_node in found.items():
        items = w.sequence(scen_node, f"{where}.{scenario}")
        if items is None:
            continue
        if not items:
            w.errors.add(scen_node, f"{where}.{scenario}",
                         "empty list (expected at least one entry)")
        for i, item in enumerate(items):
            rows.extend(_scenario_item(w, f"{where}.{scenario}[{i}]", scenario, item, entry))
    return rows


def _scenario_item(w: Walker, where: str, scenario: str, node: Node,
                   entry: EntryContext) -> list[Row]:
    if scenario == "fixed-seq-len":
        f = w.mapping(node, where, ("isl", "osl", "search-space"),
                      ("isl", "osl", "search-space"))
    else:
        f = w.mapping(node, where, ("duration", "dram-utilization", "search-space"),
                      ("search-space",))
    if f is None or "search-space" not in f:
        return []
    isl = w.integer(f["isl"], f"{where}.isl") if "isl" in f else 0
    osl = w.integer(f["osl"], f"{where}.osl") if "osl" in f else 0
    if "duration" in f:
        w.integer(f["duration"], f"{where}.duration")
    dram = (w.fraction(f["dram-utilization"], f"{where}.dram-utilization")
            if "dram-utilization" in f else None)
    space = w.sequence(f["search-space"], f"{where}.search-space")
    if space is None:
        return []
    if not space:
        w.errors.add(f["search-space"], f"{where}.search-space",
                     "empty search-space (expected at least one row)")
        return []
    rows = []
    for j, row_node in enumerate(space):
        row_where = f"{where}.search-space[{j}]"
        parsed = _search_row(w, row_where, scenario, row_node, entry, dram)
        if parsed is not None and isl is not None and osl is not None:
            shape, concs = parsed
            current = isinstance(row_node, MappingNode) and any(
                scalar(k) in ("kv-offloading", "kv-offload-backend") for k, _ in row_node.value)
            rows.append(Row(shape=shape, isl=isl, osl=osl, concurrencies=concs,
                            line=row_node.start_mark.line + 1, current_offloading=current))
    return rows


def _search_row(w: Walker, where: str, scenario: str, node: Node, entry: EntryContext,
                dram_utilization: float | None) -> tuple[Shape, tuple[int, ...]] | None:
    agentic = scenario == "agentic-coding"
    allowed = AGENTIC_KEYS if agentic else MULTI_NODE_KEYS if entry.multinode else (
        SINGLE_NODE_KEYS)
    required: tuple[str, ...] = () if agentic else ("prefill", "decode") if entry.multinode else (
        "tp",)
    f = w.mapping(node, where, allowed, required)
    if f is None:
        return None
    ok = True
    spec = (w.choice(f["spec-decoding"], f"{where}.spec-decoding", SPEC_DECODING_VALUES)
            if "spec-decoding" in f else "none")
    concs = w.concurrencies(node, f, where)
    common: dict[str, Any] = {"scenario": scenario, "spec_decoding": spec,
                              "router": entry.router, "kv_p2p_transfer": entry.kv_p2p_transfer}
    for name, attr in (("router", "router"), ("kv-p2p-transfer", "kv_p2p_transfer")):
        if name not in f:
            continue
        if getattr(entry, attr) is not None:
            w.errors.add(f[name], f"{where}.{name}", f"also given on the entry (expected "
                         f"{name} either on the entry or on its search-space rows)")
            ok = False
        elif name == "kv-p2p-transfer" and not entry.multinode:
            w.errors.add(f[name], f"{where}.{name}", "only valid when multinode is true")
            ok = False
        elif name == "router":
            common[attr] = w.component(f[name], f"{where}.{name}", version_required=True)
        else:
            common[attr] = w.string(f[name], f"{where}.{name}")
    if "recipe-fingerprint" in f:
        w.string(f["recipe-fingerprint"], f"{where}.recipe-fingerprint")
    if agentic:
        offload = _offloading(w, f, where, dram_utilization, entry.multinode)
        ok = ok and offload is not None
        common.update(offload or {})
    ok = ok and spec is not None and concs is not None and (
        common["router"] is not None or "router" not in f)
    if "prefill" in f or "decode" in f:
        if "tp" in f:
            w.errors.add(node, where, "both tp and prefill/decode given (expected either tp or "
                         "both prefill and decode)")
            return None
        prefill = _worker(w, f.get("prefill"), node, f"{where}.prefill")
        decode = _worker(w, f.get("decode"), node, f"{where}.decode")
        if (prefill is not None and decode is not None
                and bool(prefill.hardware) != bool(decode.hardware)):
            w.errors.add(node, where, "hardware given on one worker pool only (expected "
                         "hardware on both prefill and decode, or on neither)")
            return None
        if agentic and "offloading" not in f:
            for name in PARALLEL_KEYS:
                if name in f:
                    w.errors.add(f[name], f"{where}.{name}", "not valid on a multinode "
                                 "agentic row (expected it on the prefill/decode workers)")
                    ok = False
        if prefill is None or decode is None or concs is None or not ok:
            return None
        p = decode.parallel
        return Shape(**common, parallel=Parallelism(tp=p.tp, ep=p.ep, dp_attn=p.dp_attn),
                     prefill=prefill, decode=decode,
                     skip_reason=AGENTIC_SKIP if agentic else None), concs
    if "tp" not in f:
        if agentic:
            w.errors.add(node, where, "no topology (expected either tp or both prefill and "
                         "decode)")
        return None
    parallel = _parallel(w, f, where)
    if parallel is None or concs is None or not ok:
        return None
    return Shape(**common, parallel=parallel,
                 skip_reason=AGENTIC_SKIP if agentic else None), concs


def _parallel(w: Walker, f: dict[str, Node], where: str) -> Parallelism | None:
    """tp, ep, dp-attn, pp, dcp-size, pcp-size of a row or a worker (ep 1, dp-attn false...)."""
    tp = w.integer(f["tp"], f"{where}.tp") if "tp" in f else None
    ep = w.integer(f["ep"], f"{where}.ep") if "ep" in f else 1
    dp_attn = w.boolean(f["dp-attn"], f"{where}.dp-attn") if "dp-attn" in f else False
    pp = w.integer(f["pp"], f"{where}.pp") if "pp" in f else 1
    dcp = w.integer(f["dcp-size"], f"{where}.dcp-size") if "dcp-size" in f else 1
    pcp = w.integer(f["pcp-size"], f"{where}.pcp-size") if "pcp-size" in f else 1
    if tp is None or ep is None or dp_attn is None or pp is None or dcp is None or pcp is None:
        return None
    if tp % dcp:
        w.errors.add(f["dcp-size"], f"{where}.dcp-size", f"tp ({tp}) is not divisible by "
                     f"dcp-size ({dcp}) (expected a divisor of tp)")
        return None
    return Parallelism(tp=tp, ep=ep, dp_attn=dp_attn, pp=pp, dcp=dcp, pcp=pcp)


def _offloading(w: Walker, f: dict[str, Node], where: str, dram_utilization: float | None,
                multinode: bool) -> dict[str, Any] | None:
    if "offloading" in f and ("kv-offloading" in f or "kv-offload-backend" in f):
        w.errors.add(f["offloading"], f"{where}.offloading", "given with kv-offloading "
                     "(expected the older 'offloading' or 'kv-offloading', not both)")
        return None
    if "offloading" in f:
        return {"offloading": w.choice(f["offloading"], f"{where}.offloading",
                                       OFFLOADING_VALUES)}
    if "kv-offloading" not in f and not multinode and "tp" in f:
        w.errors.add(f["tp"], f"{where}", "missing required key kv-offloading (expected "
                     "'none' or 'dram' on every single-node agentic row)")
        return None
    mode = (w.choice(f["kv-offloading"], f"{where}.kv-offloading", KV_OFFLOADING_VALUES)
            if "kv-offloading" in f else "none")
    backend = None
    if "kv-offload-backend" in f:
        node = f["kv-offload-backend"]
        backend = (w.string(node, f"{where}.kv-offload-backend") if node.tag.endswith(":str")
                   else w.component(node, f"{where}.kv-offload-backend",
                                    version_required=False))
        if backend is not None and backend.partition("@")[2].startswith(IMAGE_VERSION):
            w.errors.add(node, f"{where}.kv-offload-backend.version", "an image reference "
                         "(expected the backend's own release, package version or commit)")
            return None
        if mode == "none":
            w.errors.add(node, f"{where}.kv-offload-backend", "given with kv-offloading "
                         "'none' (expected a backend only when kv-offloading is 'dram')")
            return None
    elif mode == "dram":
        w.errors.add(f["kv-offloading"], f"{where}.kv-offloading", "dram offloading without "
                     "kv-offload-backend (expected kv-offload-backend: {name: ...})")
        return None
    if mode == "dram" and dram_utilization is None:
        w.errors.add(f["kv-offloading"], f"{where}.kv-offloading", "dram offloading without "
                     "dram-utilization (expected dram-utilization on the agentic-coding entry)")
        return None
    if mode is None or ("kv-offload-backend" in f and backend is None):
        return None
    return {"offloading": mode, "kv_offload_backend": backend,
            "dram_utilization": dram_utilization if mode == "dram" else None}


def _worker(w: Walker, node: Node | None, parent: Node, where: str) -> Worker | None:
    if node is None:
        w.errors.add(parent, where, "missing required key")
        return None
    f = w.mapping(node, where, WORKER_KEYS, ("num-worker", "tp", "ep", "dp-attn"))
    if f is None or len(set(f) & {"num-worker", "tp", "ep", "dp-attn"}) < 4:
        return None
    settings: list[str | None] = []
    if "additional-settings" in f:
        for i, item in enumerate(w.sequence(f["additional-settings"],
                                            f"{where}.additional-settings") or []):
            settings.append(w.string(item, f"{where}.additional-settings[{i}]"))
    hardware = w.string(f["hardware"], f"{where}.hardware") if "hardware" in f else ""
    # 0 workers is InferenceX's aggregated mode (`decode.num-worker: 0`).
    workers = w.integer(f["num-worker"], f"{where}.num-worker", minimum=0)
    parallel = _parallel(w, f, where)
    if workers is None or parallel is None or hardware is None or None in settings:
        return None
    return Worker(num_worker=workers, parallel=parallel, hardware=hardware or None,
                  additional_settings=tuple(s for s in settings if s is not None))


def group_into_servers(entry: Callable[..., ServerConfig], rows: list[Row]
                       ) -> list[ServerConfig]:
    """One server node per distinct shape; it serves every ISL/OSL its rows give. `entry`
    makes a server of the entry from a shape's fields and the sweeps."""
    groups: dict[Shape, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.shape, []).append(row)
    servers = []
    for shape, group in groups.items():
        sweeps = tuple(SeqLenSweep(isl=r.isl, osl=r.osl, concurrencies=r.concurrencies,
                                   line=r.line) for r in group)
        values = {f.name: getattr(shape, f.name) for f in fields(shape)}
        servers.append((shape, entry(**values, sweeps=sweeps)))
    # Shapes that differ only in what a name leaves out (a router version, a DRAM share) get a
    # short digest of the whole shape, so node ids never collide.
    names = Counter(server.node_name for _, server in servers)
    return [
        replace(server, name_suffix="-x" + hashlib.sha256(repr(shape).encode()).hexdigest()[:6])
        if names[server.node_name] > 1 else server
        for shape, server in servers
    ]
