"""Server-side metrics: `/metrics` (and ATOM's `/debug/mtp_stats`) before and after a point.

Parsing is `prometheus_client`'s own parser, imported only when a scrape happens (so runs that
never scrape do not pay for it). Counters are diffed, summed over their label sets; gauges are
reported as read after the point. Acceptance length = 1 + accepted / verification steps
(performance-model.md §A7): vLLM `spec_decode_num_accepted_tokens` / `spec_decode_num_drafts`;
ATOM `mtp_accepted_tokens` / sum of `mtp_decode_steps`, or the same from `/debug/mtp_stats`.
Which names to read is each framework's registry entry (`frameworks/entries/`): its
`metrics`, `acceptance` and `debug_stats`; the frameworks are tried in the registry's order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from ..frameworks import registry
from ..results.record import number

if TYPE_CHECKING:
    from ..results.record import JSONValue, Record

SCRAPE_TIMEOUT_S = 10.0



class MissingPrometheusParser(RuntimeError):
    pass


@dataclass(frozen=True)
class Snapshot:
    counters: dict[str, float] = field(default_factory=dict)  # summed over label sets
    gauges: dict[str, float] = field(default_factory=dict)
    mtp_stats: Record | None = None
    error: str = ""
    # The simulated server's own self-check (`/debug/inferbench/info`): how far its step
    # deliveries fell behind its model's clock, cumulative since it started.
    delivery_lag: dict[str, float] | None = None


def parse_metrics(text: str) -> tuple[dict[str, float], dict[str, float]]:
    """Counter samples (`*_total`) and gauge samples, each summed over label sets; a series of
    a label some framework's metric names select by (`registry.metric_labels`) is also kept
    apart, as `name{label="value"}`."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as exc:
        raise MissingPrometheusParser(
            "reading server /metrics needs prometheus_client, a dependency of "
            "pytest-inferbench: reinstall it (pip install -e .)") from exc
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    selecting = registry.metric_labels()
    for family in text_string_to_metric_families(text):
        if family.type == "counter":
            target = counters
        elif family.type in ("gauge", "untyped", "unknown"):
            target = gauges
        else:
            continue  # histogram and summary series are the server's, not a point delta
        for sample in family.samples:
            if family.type == "counter" and not sample.name.endswith("_total"):
                continue  # `_created` timestamps
            target[sample.name] = target.get(sample.name, 0.0) + float(sample.value)
            for label in selecting.intersection(sample.labels):
                key = f'{sample.name}{{{label}="{sample.labels[label]}"}}'
                target[key] = target.get(key, 0.0) + float(sample.value)
    return counters, gauges


async def scrape(client: httpx.AsyncClient, simulated: bool = False) -> Snapshot:
    """Read `/metrics` and `/debug/mtp_stats` (and a simulated server's delivery lag); a server
    without them gives an empty snapshot."""
    try:
        response = await client.get("/metrics", timeout=SCRAPE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return Snapshot(error=f"/metrics: {type(exc).__name__}: {exc}")
    if response.status_code != 200:
        return Snapshot(error=f"/metrics: HTTP {response.status_code}")
    counters, gauges = parse_metrics(response.text)
    mtp: Record | None = None
    endpoint = next((f.debug_stats for f in registry.frameworks() if f.debug_stats and any(
        name.startswith(f.metric_prefix) for name in (*counters, *gauges))), None)
    if endpoint is not None:
        try:
            stats = await client.get(endpoint, timeout=SCRAPE_TIMEOUT_S)
            if stats.status_code == 200 and isinstance(stats.json(), dict):
                mtp = stats.json()
        except (httpx.HTTPError, ValueError):
            mtp = None
    lag = await _delivery_lag(client) if simulated else None
    return Snapshot(counters=counters, gauges=gauges, mtp_stats=mtp, delivery_lag=lag)


async def _delivery_lag(client: httpx.AsyncClient) -> dict[str, float] | None:
    try:
        info = await client.get("/debug/inferbench/info", timeout=SCRAPE_TIMEOUT_S)
        lag = info.json().get("delivery_lag") if info.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(lag, dict) or not all(
            isinstance(lag.get(k), (int, float)) for k in ("steps", "mean_s", "max_s")):
        return None
    return {k: float(v) for k, v in lag.items() if isinstance(v, (int, float))}


def lag_during(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """The delivery lag of the steps between two reads: their number, mean, and how many were
    late by more than 5 ms; the largest lag since the server started comes along."""
    steps = after["steps"] - before["steps"]
    total = after["mean_s"] * after["steps"] - before["mean_s"] * before["steps"]
    late = after.get("steps_over_5ms", 0.0) - before.get("steps_over_5ms", 0.0)
    return {"steps": steps, "mean_s": total / steps if steps > 0 else 0.0,
            "steps_over_5ms": late, "max_s_since_start": after["max_s"]}


def _delta(before: Mapping[str, float], after: Mapping[str, float], name: str) -> float | None:
    if name not in after:
        return None
    return after[name] - before.get(name, 0.0)


def _mtp_al(before: Record | None, after: Record | None) -> float | None:
    if not after or not after.get("enabled", True):
        return None
    before = before or {}

    def steps(stats: Record) -> float:
        dist = stats.get("distribution") or {}
        return sum(number(v) or 0.0 for v in dist.values()) if isinstance(dist, Mapping) else 0.0

    d_steps = steps(after) - steps(before)
    d_acc = (number(after.get("total_accepted_tokens")) or 0.0) - (
        number(before.get("total_accepted_tokens")) or 0.0)
    return 1.0 + d_acc / d_steps if d_steps > 0 else None


def point_metrics(before: Snapshot, after: Snapshot) -> dict[str, JSONValue]:
    """Counter deltas, gauges after, acceptance length, KV usage and preemptions."""
    out: dict[str, JSONValue] = {}
    if before.error or after.error:
        out["scrape_error"] = before.error or after.error
    deltas = {name: after.counters[name] - before.counters.get(name, 0.0)
              for name in after.counters}
    out["counter_deltas"] = deltas
    out["gauges"] = dict(after.gauges)

    al = None
    source = None
    for framework in registry.frameworks():
        how = framework.acceptance
        if how is None:
            continue
        accepted = _delta(before.counters, after.counters, how.accepted)
        steps = _delta(before.counters, after.counters, how.steps)
        if accepted is not None and steps:
            al, source = 1.0 + accepted / steps, how.source
            drafted = _delta(before.counters, after.counters, how.drafted)
            if drafted:
                out["acceptance_rate"] = accepted / drafted
            break
    mtp_al = _mtp_al(before.mtp_stats, after.mtp_stats)
    if after.mtp_stats is not None:
        out["mtp_stats_acceptance_length"] = mtp_al
    if al is None and mtp_al is not None:
        al, source = mtp_al, "/debug/mtp_stats"
    if al is not None:
        out["acceptance_length"] = al
        out["acceptance_length_source"] = source

    if before.delivery_lag is not None and after.delivery_lag is not None:
        out["delivery_lag"] = lag_during(before.delivery_lag, after.delivery_lag)

    gauges = [g for f in registry.frameworks() for g in f.kv_usage_gauges]
    usage = next((after.gauges[g] for g in gauges if g in after.gauges), None)
    if usage is not None:
        out["kv_cache_usage"] = usage
    counters = [c for f in registry.frameworks() if (c := f.preemption_counter)]
    preempted = next((d for c in counters
                      if (d := _delta(before.counters, after.counters, c)) is not None), None)
    if preempted is not None:
        out["preemptions"] = preempted
    tiers = kv_tiers(before, after)
    if tiers:
        out["kv_tiers"] = tiers
    return out


# The KV-tier quantities a point reports (registry `metrics` keys), counters as deltas.
KV_TIER_COUNTERS = ("prefix_cache_hits", "device_cache_hits", "host_cache_queries",
                    "host_cache_hits", "offload_bytes_written", "offload_bytes_read",
                    "offload_seconds_written", "offload_seconds_read")
KV_TIER_GAUGES = ("host_tokens_used", "host_tokens_total")


def kv_tiers(before: Snapshot, after: Snapshot) -> dict[str, JSONValue]:
    """A CPU-DRAM KV tier's numbers, under the quantity names, from the first framework whose
    tier metrics the server exports: prompt tokens found in HBM (`hbm_hit_tokens`) and in DRAM
    (`dram_hit_tokens`), the bytes copied each way. Empty when the server has no such tier."""
    for framework in registry.frameworks():
        names = framework.metrics
        if "host_cache_hits" not in names:
            continue
        hits = registry.sample_name(names["host_cache_hits"], counter=True)
        if hits not in after.counters:
            continue
        out: dict[str, JSONValue] = {}
        for key in KV_TIER_COUNTERS:
            if key in names:
                name = registry.sample_name(names[key], counter=True)
                out[key] = _delta(before.counters, after.counters, name)
        for key in KV_TIER_GAUGES:
            if key in names:
                out[key] = after.gauges.get(registry.sample_name(names[key], counter=False))
        hbm = out.get("device_cache_hits", out.get("prefix_cache_hits"))
        out["hbm_hit_tokens"] = hbm
        out["dram_hit_tokens"] = out["host_cache_hits"]
        return out
    return {}
