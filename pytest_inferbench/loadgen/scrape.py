"""Server-side metrics: `/metrics` (and ATOM's `/debug/mtp_stats`) before and after a point.

Parsing is `prometheus_client`'s own parser, imported only when a scrape happens (so runs that
never scrape do not pay for it). Counters are diffed, summed over their label sets; gauges are
reported as read after the point. Acceptance length = 1 + accepted / verification steps
(performance-model.md §A7): vLLM `spec_decode_num_accepted_tokens` / `spec_decode_num_drafts`;
ATOM `mtp_accepted_tokens` / sum of `mtp_decode_steps`, or the same from `/debug/mtp_stats`.
Which names to read is each framework's registry entry (`frameworks/entries/`): its
`metrics`, `acceptance`, `debug_stats` and `latency_histograms`; the frameworks are tried in the
registry's order. The latency histograms named there are kept bucket by bucket, and their
difference over the point summarized (`results/server_latency.py`). KV-cache usage is a gauge:
read after the point it says nothing of the point (the server is idle by then), so it is
sampled during the point (`loadgen/server_sampler.py`) and stated as its peak and mean.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from ..frameworks import registry
from ..results import server_latency
from ..results.record import number

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

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
    # The latency histograms some framework's registry entry names, summed over label sets.
    histograms: dict[str, Histogram] = field(default_factory=dict)


@dataclass(frozen=True)
class Histogram:
    """One histogram as scraped: cumulative counts per upper bound, count and sum."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    total: float


@dataclass(frozen=True)
class Exposition:
    """What one `/metrics` text says: counters and gauges summed over label sets, histograms."""

    counters: dict[str, float]
    gauges: dict[str, float]
    histograms: dict[str, Histogram]


def _families(text: str) -> Iterable[Metric]:
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as exc:
        raise MissingPrometheusParser(
            "reading server /metrics needs prometheus_client, a dependency of "
            "pytest-inferbench: reinstall it (pip install -e .)") from exc
    return text_string_to_metric_families(text)


def parse_metrics(text: str) -> tuple[dict[str, float], dict[str, float]]:
    """Counter samples (`*_total`) and gauge samples, each summed over label sets; a series of
    a label some framework's metric names select by (`registry.metric_labels`) is also kept
    apart, as `name{label="value"}`."""
    parsed = parse_exposition(text)
    return parsed.counters, parsed.gauges


def histogram_names() -> frozenset[str]:
    """Every latency histogram a framework's registry entry names."""
    return frozenset(name for f in registry.frameworks() for name in f.latency_histograms.values())


def parse_exposition(text: str) -> Exposition:
    """Counters (`*_total`), gauges and the registry's latency histograms of one scrape."""
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    selecting = registry.metric_labels()
    wanted = histogram_names()
    histograms: dict[str, Histogram] = {}
    for family in _families(text):
        if family.type == "histogram":
            if family.name in wanted:
                histograms[family.name] = _histogram(family)
            continue
        if family.type == "counter":
            target = counters
        elif family.type in ("gauge", "untyped", "unknown"):
            target = gauges
        else:
            continue  # summaries: no framework's registry entry reads one
        for sample in family.samples:
            if family.type == "counter" and not sample.name.endswith("_total"):
                continue  # `_created` timestamps
            target[sample.name] = target.get(sample.name, 0.0) + float(sample.value)
            for label in selecting.intersection(sample.labels):
                key = f'{sample.name}{{{label}="{sample.labels[label]}"}}'
                target[key] = target.get(key, 0.0) + float(sample.value)
    return Exposition(counters, gauges, histograms)


def _histogram(family: Metric) -> Histogram:
    """A histogram family summed over its label sets (an engine or a model each), bound by
    bound."""
    buckets: dict[float, float] = {}
    count = total = 0.0
    for sample in family.samples:
        if sample.name.endswith("_bucket"):
            le = float(sample.labels.get("le", "+Inf"))
            buckets[le] = buckets.get(le, 0.0) + float(sample.value)
        elif sample.name.endswith("_count"):
            count += float(sample.value)
        elif sample.name.endswith("_sum"):
            total += float(sample.value)
    return Histogram(tuple(sorted(buckets.items())), count, total)


async def scrape(client: httpx.AsyncClient, simulated: bool = False) -> Snapshot:
    """Read `/metrics` and `/debug/mtp_stats` (and a simulated server's delivery lag); a server
    without them gives an empty snapshot."""
    try:
        response = await client.get("/metrics", timeout=SCRAPE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return Snapshot(error=f"/metrics: {type(exc).__name__}: {exc}")
    if response.status_code != 200:
        return Snapshot(error=f"/metrics: HTTP {response.status_code}")
    parsed = parse_exposition(response.text)
    counters, gauges = parsed.counters, parsed.gauges
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
    return Snapshot(counters=counters, gauges=gauges, mtp_stats=mtp, delivery_lag=lag,
                    histograms=parsed.histograms)


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


def point_metrics(before: Snapshot, after: Snapshot,
                  sampled: Mapping[str, JSONValue] | None = None) -> dict[str, JSONValue]:
    """Counter deltas, gauges after, acceptance length, latency histograms over the point,
    what was sampled during it (`sampled`: KV usage, `server_sampler.GaugeSamples.describe`)
    and preemptions."""
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

    latency = latency_histograms(before, after)
    if latency:
        out["latency_histograms"] = latency
    if sampled:
        out.update(sampled)
    counters = [c for f in registry.frameworks() if (c := f.preemption_counter)]
    preempted = next((d for c in counters
                      if (d := _delta(before.counters, after.counters, c)) is not None), None)
    if preempted is not None:
        out["preemptions"] = preempted
    tiers = kv_tiers(before, after)
    if tiers:
        out["kv_tiers"] = tiers
    return out


def latency_histograms(before: Snapshot, after: Snapshot) -> dict[str, JSONValue]:
    """The first framework's latency histograms (in the registry's order) that the server
    exports, each as its difference over the point (`results/server_latency.summary`)."""
    for framework in registry.frameworks():
        names = framework.latency_histograms
        if not names or not any(name in after.histograms for name in names.values()):
            continue
        out: dict[str, JSONValue] = {}
        for quantity, name in names.items():
            hist = after.histograms.get(name)
            if hist is None:
                continue
            earlier = before.histograms.get(name, Histogram((), 0.0, 0.0))
            diff = server_latency.delta(earlier.buckets, hist.buckets,
                                        (earlier.count, hist.count),
                                        (earlier.total, hist.total))
            out[quantity] = server_latency.summary(name, diff)
        return out
    return {}


def kv_usage_gauges() -> tuple[str, ...]:
    """Every KV-cache usage gauge name the registry knows, in its order."""
    return tuple(g for f in registry.frameworks() for g in f.kv_usage_gauges)


def read_gauge(text: str, names: tuple[str, ...]) -> tuple[str, float] | None:
    """The first of `names` that `text` exports, as (name, value); a gauge with several label
    sets (one per engine of a data-parallel server) is their mean: each is a share of its own
    engine's cache, and a sum would pass 1."""
    found: dict[str, list[float]] = {}
    for family in _families(_lines_of(text, names)):
        if family.name in names and family.type in ("gauge", "untyped", "unknown"):
            found[family.name] = [float(s.value) for s in family.samples]
    for name in names:
        values = found.get(name)
        if values:
            return name, sum(values) / len(values)
    return None


def _lines_of(text: str, names: tuple[str, ...]) -> str:
    """The lines of `text` that speak of `names` (their samples, HELP and TYPE): a real
    server's page holds hundreds of histogram series, and the parser need not read them to find
    one gauge."""
    heads = tuple(f"{name}{{" for name in names) + tuple(f"{name} " for name in names) + tuple(
        f"# {kind} {name} " for name in names for kind in ("HELP", "TYPE"))
    return "".join(line for line in text.splitlines(keepends=True) if line.startswith(heads))




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
        for key in registry.KV_TIER_COUNTERS:
            if key in names:
                name = registry.sample_name(names[key], counter=True)
                out[key] = _delta(before.counters, after.counters, name)
        for key in registry.KV_TIER_GAUGES:
            if key in names:
                out[key] = after.gauges.get(registry.sample_name(names[key], counter=False))
        hbm = out.get("device_cache_hits", out.get("prefix_cache_hits"))
        out["hbm_hit_tokens"] = hbm
        out["dram_hit_tokens"] = out["host_cache_hits"]
        return out
    return {}
