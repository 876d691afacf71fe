"""An agentic point's server metrics as InferenceX has them (agentic.md §4.3): what the point's
`/metrics` scrapes said, in the form of AIPerf's `server_metrics_export.json`, and the
`server_metrics` block InferenceX's aggregation makes of that export.

The export (`export`), from the point's `server_metrics` (`loadgen/scrape.point_metrics`):

- every counter family (AIPerf's names, without `_total`) with its increase over the measured
  phase as `stats.total` (the scrapes bracket the profiling phase: the replay's primers and
  warmup requests are not counted, as the point's records do not count them); a family the
  scrape kept apart by a label (`sglang:cached_tokens` by `cache_source`) as one series per
  value, and then only those (the plain sum would count them twice);
- the KV-usage gauge sampled during the point with its peak as `max` and its mean as `avg`;
  every other gauge with its value at the point's end as both, the one reading there is.

A point simulated in process was not scraped: its engine's counters over the point
(`sim/driver.server_metrics`) stand in for the scrapes, under the names the server of its
framework exports them (the simulated HTTP server's persona, from the framework registry),
the KV usage as its peak.

The block (`server_block`) reads that export as InferenceX's adapter of the server's framework
does, picked by the metric names (SGLang's before vLLM's): counters summed over series
(`total`, else `sum`, `max`, `avg`), gauges the largest over series (`max`, else `avg`,
`total`), a usage above 1.5 read as a percentage, a rate None without a positive
denominator. A server no adapter reads (ATOM, TRT-LLM) and a Dynamo deployment (InferenceX
reads its frontend's metrics, which the simulator does not export) get no export: the
block is the empty one with the records' totals, as InferenceX makes it without an export.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..frameworks import registry
from ..frameworks.registry import split_metric
from .measurement import ENGINE_COUNTERS
from .record import mapping

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .record import JSONValue

# InferenceX's adapters, in the order it tries them, by the prefix of the names they read.
ADAPTERS = (("sglang", "sglang:"), ("vllm", "vllm:"))
DYNAMO_PREFIX = "dynamo"  # frameworks whose metrics InferenceX reads from a Dynamo frontend
COUNTER_STATS = ("total", "sum", "max", "avg")
GAUGE_STATS = ("max", "avg", "total")
PERCENT_ABOVE = 1.5  # a usage gauge above this is in percent, not a fraction
NO_EXPORT = "server_metrics_export.json missing or empty"  # InferenceX's warning
# What the export's numbers are, in the export itself.
SCRAPE_NOTE = ("counters: their increase over the profiling phase, warmup excluded; the "
               "KV-usage gauge: its peak and mean sampled during it; other gauges: their value "
               "at its end")
ENGINE_NOTE = ("simulated in process: the engine's counters over the whole replay, warmup "
               "included, and its gauges at the end, under the names its framework's server "
               "exports; KV usage: its peak")



def adapter_of(framework: str, names: list[str]) -> str | None:
    """The InferenceX adapter that would read an export with `names`, None where none would."""
    if framework.lower().startswith(DYNAMO_PREFIX):
        return None
    return next((a for a, prefix in ADAPTERS if any(n.startswith(prefix) for n in names)), None)


# The engine's counters and gauges a point simulated in process reports (`kv_tiers` holds the
# CPU-DRAM tier's), by their registry quantity names.
ENGINE_COUNTED = ("prompt_tokens", "generation_tokens", "prefix_cache_queries",
                  "prefix_cache_hits", *registry.KV_TIER_COUNTERS)
ENGINE_GAUGES = ("prefix_cache_hit_rate", *registry.KV_TIER_GAUGES)


def as_scraped(server: Mapping[str, JSONValue], framework: str) -> Mapping[str, JSONValue]:
    """A point's server metrics as a scrape has them: a scrape's as they are, the engine's
    counters of a point simulated in process under its framework server's names."""
    if server.get("source") != ENGINE_COUNTERS:
        return server
    try:
        names = registry.get(registry.engine_of(framework)).metrics
    except registry.FrameworkError:
        return {}
    counted = {**server, **mapping(server.get("kv_tiers"))}
    if "kv_tiers" in server:  # beside the DRAM tier's hits, the HBM ones: the prefix cache's
        counted.setdefault("device_cache_hits", counted.get("prefix_cache_hits"))
    counters: dict[str, JSONValue] = {
        registry.sample_name(names[q], counter=True): counted[q] for q in ENGINE_COUNTED
        if q in names and isinstance(counted.get(q), (int, float))}
    gauges: dict[str, JSONValue] = {
        registry.sample_name(names[q], counter=False): counted[q] for q in ENGINE_GAUGES
        if q in names and isinstance(counted.get(q), (int, float))}
    peak = server.get("max_kv_cache_usage")
    usage = names.get("kv_usage")
    if usage is not None and isinstance(peak, (int, float)):
        gauges[usage] = peak
    return {"counter_deltas": counters, "gauges": gauges, "kv_cache_usage_gauge": usage,
            "kv_cache_usage_peak": peak}


def export(server: Mapping[str, JSONValue], framework: str) -> dict[str, JSONValue] | None:
    """`server_metrics_export.json` of a point's `server_metrics` (module doc); None where
    InferenceX reads none (no scrape, or no adapter for the server's names)."""
    engine = server.get("source") == ENGINE_COUNTERS
    server = as_scraped(server, framework)
    families: dict[str, tuple[str, list[JSONValue], list[JSONValue]]] = {}

    def add(key: str, kind: str, stats: dict[str, JSONValue]) -> None:
        family, label = split_metric(key)
        if kind == "counter":
            family = family.removesuffix("_total")
        _, plain, labelled = families.setdefault(family, (kind, [], []))
        if label is None:
            plain.append({"labels": {}, "stats": stats})
        else:
            labelled.append({"labels": {label[0]: label[1]}, "stats": stats})

    for key, value in mapping(server.get("counter_deltas")).items():
        add(key, "counter", {"total": value})
    sampled = server.get("kv_cache_usage_gauge")
    peak, mean = server.get("kv_cache_usage_peak"), server.get("kv_cache_usage_mean")
    for key, value in mapping(server.get("gauges")).items():
        if key == sampled and peak is not None:
            add(key, "gauge", {"max": peak, "avg": mean if mean is not None else peak})
        else:
            add(key, "gauge", {"max": value, "avg": value})
    if adapter_of(framework, list(families)) is None:
        return None
    metrics: dict[str, JSONValue] = {
        name: {"type": kind, "series": list(labelled or plain)}
        for name, (kind, plain, labelled) in sorted(families.items())}
    return {"metrics": metrics, "inferbench": ENGINE_NOTE if engine else SCRAPE_NOTE}


def _number(value: JSONValue) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _series(metrics: Mapping[str, JSONValue], name: str) -> list[Mapping[str, JSONValue]]:
    entry = mapping(metrics.get(name))
    found = entry.get("series")
    return [mapping(s) for s in found] if isinstance(found, list) else []


def _stat(series: Mapping[str, JSONValue], keys: tuple[str, ...]) -> float | None:
    stats = mapping(series.get("stats"))
    return next((v for k in keys if (v := _number(stats.get(k))) is not None), None)


def _label(series: Mapping[str, JSONValue], key: str) -> str | None:
    value = mapping(series.get("labels")).get(key)
    return None if value is None else str(value)


class _Reader:
    """The export's numbers as InferenceX's adapters read them."""

    def __init__(self, metrics: Mapping[str, JSONValue]) -> None:
        self.metrics = metrics

    def total(self, name: str, keys: tuple[str, ...] = COUNTER_STATS,
              where: Callable[[Mapping[str, JSONValue]], bool] | None = None) -> float | None:
        values = [v for s in _series(self.metrics, name)
                  if (where is None or where(s)) and (v := _stat(s, keys)) is not None]
        return sum(values) if values else None

    def gauge(self, *names: str, keys: tuple[str, ...] = GAUGE_STATS,
              average: bool = False) -> float | None:
        values = [v for n in names for s in _series(self.metrics, n)
                  if (v := _stat(s, keys)) is not None]
        if not values:
            return None
        return sum(values) / len(values) if average else max(values)

    def by_label(self, name: str, key: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in _series(self.metrics, name):
            label, value = _label(s, key), _stat(s, COUNTER_STATS)
            if label is not None and value is not None:
                out[label] = out.get(label, 0.0) + value
        return out


def _rate(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _fraction(value: float | None) -> float | None:
    return value / 100.0 if value is not None and value > PERCENT_ABOVE else value


def _part(block: dict[str, JSONValue], key: str) -> dict[str, JSONValue]:
    part = block[key]
    assert isinstance(part, dict)  # the block's parts are `empty_block`'s dicts
    return part


def _count(value: float | None) -> int | None:
    return None if value is None else round(value)


def empty_block(present: bool = False, metric_count: int = 0) -> dict[str, JSONValue]:
    """The block with every value unknown, as InferenceX starts it."""
    cache: dict[str, JSONValue] = dict.fromkeys((
        "gpu_cache_hit_rate", "cpu_cache_hit_rate", "external_cache_hit_rate",
        "overall_cache_hit_rate", "prefix_cache_hits", "prefix_cache_queries",
        "external_prefix_cache_hits", "external_prefix_cache_queries"))
    cache["cached_tokens_by_source"] = {}
    cache |= dict.fromkeys(("frontend_cache_hit_rate", "router_kv_hit_rate",
                            "router_shared_cache_hit_rate", "frontend_cached_tokens",
                            "frontend_input_tokens"))
    return {
        "present": present, "adapter": "none", "metric_count": metric_count, "cache": cache,
        "kv_cache": dict.fromkeys(("gpu_usage_pct", "gpu_total_tokens", "cpu_usage_pct",
                                   "cpu_used_tokens", "cpu_total_tokens")),
        "kv_offload": dict.fromkeys(("bytes_gpu_to_cpu", "bytes_cpu_to_gpu",
                                     "time_gpu_to_cpu", "time_cpu_to_gpu",
                                     "bandwidth_gpu_to_cpu_bytes_per_second",
                                     "bandwidth_cpu_to_gpu_bytes_per_second")),
        "tokens": {"prompt_total": None, "generation_total": None, "requests_completed": None,
                   "prompt_by_source": {"gpu_cache_hit": None,
                                        "cpu_or_external_cache_hit": None,
                                        "computed": None, "raw": {}}},
        "sources": [],
    }


def server_block(exported: Mapping[str, JSONValue] | None, framework: str,
                 totals: Mapping[str, JSONValue]) -> tuple[dict[str, JSONValue], list[str]]:
    """(the `server_metrics` block, InferenceX's warnings) of `exported` (None: no export);
    `totals` the profiled successes' prompt and generation tokens and count, what a block
    without the server's own counts falls back to."""
    metrics = mapping(mapping(exported).get("metrics"))
    block = empty_block(bool(metrics), len(metrics))
    adapter = adapter_of(framework, list(metrics)) if metrics else None
    warnings = [] if metrics else [NO_EXPORT]
    tokens = _part(block, "tokens")
    if adapter is not None:
        block["adapter"] = adapter
        (_sglang if adapter == "sglang" else _vllm)(_Reader(metrics), block)
    if tokens.get("prompt_total") is None:
        tokens["prompt_total"] = totals.get("prompt_tokens")
    if tokens.get("generation_total") is None:
        tokens["generation_total"] = totals.get("generation_tokens")
    tokens["requests_completed"] = totals.get("requests")
    return block, warnings


def _sglang(read: _Reader, block: dict[str, JSONValue]) -> None:
    prompt = read.total("sglang:prompt_tokens")
    cached = read.by_label("sglang:cached_tokens", "cache_source")
    device, host = cached.get("device"), cached.get("host")
    overall = _rate(sum(cached.values()) if cached else None, prompt)
    if overall is None:
        overall = _fraction(read.gauge("sglang:cache_hit_rate", keys=("avg", "max", "total"),
                                       average=True))
    cpu = _rate(host, prompt)
    _part(block, "cache").update({
        "gpu_cache_hit_rate": _rate(device, prompt), "cpu_cache_hit_rate": cpu,
        "external_cache_hit_rate": cpu, "overall_cache_hit_rate": overall,
        "cached_tokens_by_source": dict(cached)})
    used = read.gauge("sglang:hicache_host_used_tokens")
    held = read.gauge("sglang:hicache_host_total_tokens")
    _part(block, "kv_cache").update({
        "gpu_usage_pct": _fraction(read.gauge("sglang:token_usage")),
        "gpu_total_tokens": _count(read.total("sglang:max_total_num_tokens",
                                              ("max", "avg", "total", "sum"))),
        "cpu_usage_pct": _rate(used, held), "cpu_used_tokens": used, "cpu_total_tokens": held})
    computed = read.total("sglang:realtime_tokens",
                          where=lambda s: _label(s, "mode") == "prefill_compute")
    _part(block, "tokens").update({
        "prompt_total": _count(prompt),
        "generation_total": _count(read.total("sglang:generation_tokens")),
        "prompt_by_source": {"gpu_cache_hit": device, "cpu_or_external_cache_hit": host,
                             "computed": computed, "raw": dict(cached)}})


def _vllm(read: _Reader, block: dict[str, JSONValue]) -> None:
    hits, queries = read.total("vllm:prefix_cache_hits"), read.total("vllm:prefix_cache_queries")
    ext_hits = read.total("vllm:external_prefix_cache_hits")
    ext_queries = read.total("vllm:external_prefix_cache_queries")
    gpu, external = _rate(hits, queries), _rate(ext_hits, ext_queries)
    cpu, overall = external, gpu
    by_source = read.by_label("vllm:prompt_tokens_by_source", "source")
    if by_source:
        local, transfer = by_source.get("local_cache_hit"), by_source.get("external_kv_transfer")
        whole = sum(by_source.values())
        overall = None
        if whole > 0:
            gpu = local / whole if local is not None else gpu
            if transfer is not None:
                cpu = external = transfer / whole
            overall = ((local or 0.0) + (transfer or 0.0)) / whole
        _part(block, "tokens")["prompt_by_source"] = {
            "gpu_cache_hit": local, "cpu_or_external_cache_hit": transfer,
            "computed": by_source.get("local_compute"), "raw": dict(by_source)}
    _part(block, "cache").update({
        "gpu_cache_hit_rate": gpu, "cpu_cache_hit_rate": cpu, "external_cache_hit_rate": external,
        "overall_cache_hit_rate": overall, "prefix_cache_hits": hits,
        "prefix_cache_queries": queries, "external_prefix_cache_hits": ext_hits,
        "external_prefix_cache_queries": ext_queries})
    _part(block, "kv_cache").update({
        "gpu_usage_pct": _fraction(read.gauge("vllm:kv_cache_usage_perc",
                                              "vllm:gpu_cache_usage_perc")),
        "cpu_usage_pct": _fraction(read.gauge("vllm:cpu_kv_cache_usage_perc"))})
    moved = {f"{what}_{way}": read.total(f"vllm:kv_offload_{what}_{way}")
             for what in ("bytes", "time") for way in ("gpu_to_cpu", "cpu_to_gpu")}
    _part(block, "kv_offload").update({
        **moved, **{f"bandwidth_{way}_bytes_per_second":
                    _rate(moved[f"bytes_{way}"], moved[f"time_{way}"])
                    for way in ("gpu_to_cpu", "cpu_to_gpu")}})
    _part(block, "tokens").update({
        "prompt_total": _count(read.total("vllm:prompt_tokens")),
        "generation_total": _count(read.total("vllm:generation_tokens"))})
    block["sources"] = _vllm_sources(read)


def _vllm_sources(read: _Reader) -> list[JSONValue]:
    """InferenceX's per-source rows; every series of this export is one server's whole
    (no role, endpoint or rank labels): one row, `combined`, when it has any of the names."""
    names = ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prefix_cache_hits",
             "vllm:prefix_cache_queries", "vllm:kv_cache_usage_perc",
             "vllm:prompt_tokens_by_source")
    if not any(_series(read.metrics, n) for n in names):
        return []
    return [{"id": "combined", "role": "combined",
             "prompt_tokens": read.total("vllm:prompt_tokens"),
             "generation_tokens": read.total("vllm:generation_tokens"),
             "prefix_cache_hit_rate": _rate(read.total("vllm:prefix_cache_hits"),
                                            read.total("vllm:prefix_cache_queries")),
             "gpu_kv_cache_usage_pct": _fraction(read.gauge("vllm:kv_cache_usage_perc",
                                                            "vllm:gpu_cache_usage_perc"))}]
