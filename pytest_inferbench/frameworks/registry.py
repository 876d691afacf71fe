"""Every serving framework the plugin knows, one YAML file each under `frameworks/entries/`.

A framework's file is the one place that says what it is to every part of the plugin:

- `name`: the engine as a recipe's `framework` names it and as launch specs end
  (`<prefix>_<precision>_<gpu>_<name>.yaml`); `aliases` are other spellings of it inside a
  multinode recipe framework (`dynamo-trtllm` -> trt).
- `order`: the order frameworks are tried in, lowest first, where several could match (a
  launch argv's words, a `/metrics` exposition's names).
- `argv_words`: a launch argv whose first words contain one of these starts this framework.
- `programs`: executables that start it; `<program> [serve]` is not one of the server's flags.
- `options_file`: true when its `--config` / `--extra-llm-api-options` names an options YAML
  that the simulator reads (TensorRT-LLM's); otherwise such a flag is reported as ignored.
- `data_parallel_attention`: true when `--data-parallel-size N` without DP-attention flags
  still means N attention ranks over N x TP GPUs (vLLM on MoE models); otherwise it is N
  independent replicas, which the simulator does not model.
- `dp_attention_needs_dp`: true when the DP-attention flag does nothing without a data-parallel
  size above 1 (SGLang turns `--enable-dp-attention` off when `--dp-size` is 1, its default).
- `persona`: whose metric names the simulated server exposes for it (a framework whose own
  names are not modelled borrows another's).
- `metrics`: each engine quantity (a `sim/server/prom.MetricsSnapshot` attribute) -> the name the
  server exports it under (counters without `_total`); what the simulated server exposes
  and what the client's scraper reads. A name may end in one `{label="value"}`: one series
  of a labelled family (SGLang's `sglang:cached_tokens{cache_source="host"}`).
  `latency_histograms`: ttft/itl/e2e/tpot -> histogram names.
- `older_kv_usage`: KV-usage gauge names of older releases that the scraper also reads.
- `acceptance`: how the scraper reads the acceptance length from the counters: 1 + the
  `accepted_tokens` metric / the `steps` quantity's (the one that counts verify steps), the
  rate over `draft_tokens`; `source` is the result's `acceptance_length_source`. Or null.
- `debug_stats`: the path of a JSON endpoint with the speculative-decoding counters in ATOM's
  `/debug/mtp_stats` shape (the simulated server serves it, the scraper reads it), or null.
- `speculative`: `reader`, the family reader of `frameworks/specdecode.py` that reads its
  speculative decoding (`atom`, `vllm`, `sglang`, `trtllm`; a framework that spells it as one
  of them names that one; null: none); `flags`, the value-taking launch flags it reads; and
  `synthetic_acceptance`, the knobs that force acceptance, as `SpeculativeDecoding.forced_by`
  names them.
- `router`: the router policy of the engine's own disaggregated deployment (default
  round-robin); `multinode`: each multinode recipe framework that serves this engine -> its
  default router policy; its packaged launch spec is `launch_specs/multinode/<name>.yaml`.
- `kv_offload`: each KV-offload backend of an agentic `kv-offloading: dram` point (`hicache`,
  `vllm-simple`, ...) -> the `args` and `env` the launch adds to serve it and the flags it
  `drop`s (the tier extends the prefix cache, which a spec may turn off), sized by the
  placeholders `{total_cpu_dram_gb}` (the point's DRAM budget), `{cpu_dram_gb_per_rank}` and
  `{cpu_dram_bytes_per_rank}` (split over its TP ranks), as InferenceX's scripts pass them.
- `prefix_caching_off`: the launch words that turn its prefix cache off (a fixed-seq-len
  spec's `--disable-radix-cache`); an agentic-coding point's server drops them, since a
  trace replay measures the prefix cache (InferenceX's agentic scripts never pass them).
- `simulator`: the simulated engine's profile (the docstring of `sim/catalog.Framework`, which
  reads it, describes the keys; `docs/simulator.md` the calibrated values).

Adding a framework is one new file here, or `register()` of a mapping of the same shape (a
project's conftest may do so for a framework of its own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

__all__ = [
    "Acceptance",
    "FrameworkEntry",
    "FrameworkError",
    "default_router",
    "engine_of",
    "entry",
    "frameworks",
    "get",
    "metric_labels",
    "names",
    "of_argv",
    "personas",
    "register",
    "sample_name",
    "split_metric",
    "unregister",
]

ENTRIES = "entries"


class FrameworkError(ValueError):
    """An unknown framework name, or an entry that does not have the registry's shape."""


@dataclass(frozen=True)
class Acceptance:
    """The server counters that give the acceptance length: 1 + accepted / verify steps."""

    accepted: str  # counter names as scraped (with `_total`)
    steps: str
    drafted: str
    source: str


@dataclass(frozen=True)
class FrameworkEntry:
    """One framework's entry (the module docstring says what each field means)."""

    name: str
    order: int
    argv_words: tuple[str, ...]
    programs: tuple[str, ...]
    aliases: tuple[str, ...]
    options_file: bool
    data_parallel_attention: bool
    persona: str
    metrics: Mapping[str, str]
    latency_histograms: Mapping[str, str]
    older_kv_usage: tuple[str, ...]
    acceptance: Acceptance | None
    debug_stats: str | None
    speculative_reader: str | None
    speculative_flags: tuple[str, ...]
    synthetic_acceptance: tuple[str, ...]
    router: str
    multinode: Mapping[str, str]
    simulator: Mapping[str, Any]
    kv_offload: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    prefix_caching_off: tuple[str, ...] = ()
    dp_attention_needs_dp: bool = False

    @property
    def metric_prefix(self) -> str:
        """`vllm:`: what every metric name of this framework starts with ("" without names)."""
        return next((n.partition(":")[0] + ":" for n in self.metrics.values()), "")

    @property
    def kv_usage_gauges(self) -> tuple[str, ...]:
        own = (self.metrics["kv_usage"],) if "kv_usage" in self.metrics else ()
        return own + self.older_kv_usage

    @property
    def preemption_counter(self) -> str | None:
        name = self.metrics.get("preemptions")
        return f"{name}_total" if name else None


def split_metric(name: str) -> tuple[str, tuple[str, str] | None]:
    """`family{label="value"}` -> (family, (label, value)); a plain name -> (name, None)."""
    family, brace, rest = name.partition("{")
    if not brace:
        return name, None
    label, _, value = rest.rstrip("}").partition("=")
    return family, (label.strip(), value.strip().strip('"'))


# The KV-tier quantities a point reports (registry `metrics` keys, and the simulator's engine
# counters of the same names), counters as deltas over the point, gauges as read after it.
KV_TIER_COUNTERS = ("prefix_cache_hits", "device_cache_hits", "host_cache_queries",
                    "host_cache_hits", "offload_bytes_written", "offload_bytes_read",
                    "offload_seconds_written", "offload_seconds_read")
KV_TIER_GAUGES = ("host_tokens_used", "host_tokens_total")


def sample_name(name: str, *, counter: bool) -> str:
    """How a scrape keys a metric's sample: counters with `_total`, a labelled series as
    `family_total{label="value"}` (`loadgen/scrape.parse_metrics`)."""
    family, label = split_metric(name)
    key = f"{family}_total" if counter else family
    return key if label is None else f'{key}{{{label[0]}="{label[1]}"}}'


_REQUIRED = ("name", "order", "argv_words", "programs", "persona", "metrics", "speculative",
             "simulator")
# The packaged entries, read once; those registered at run time are kept apart so that
# `unregister` can only take back what `register` added.
_packaged: dict[str, FrameworkEntry] = {}
_registered: dict[str, FrameworkEntry] = {}


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FrameworkError(f"{where}: expected a list of strings")
    return tuple(value)


def _mapping(value: object, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FrameworkError(f"{where}: expected a mapping")
    return {str(k): v for k, v in value.items()}


def entry(data: Mapping[str, Any], where: str = "framework entry") -> FrameworkEntry:
    """An entry from its mapping; `FrameworkError` names the key that is wrong."""
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise FrameworkError(f"{where}: missing {', '.join(missing)}")
    name = str(data["name"])
    metrics = {k: str(v) for k, v in _mapping(data["metrics"], f"{where}: metrics").items()}
    counters = {k: f"{v}_total" for k, v in metrics.items()}
    acceptance = None
    if data.get("acceptance"):
        how = _mapping(data["acceptance"], f"{where}: acceptance")
        try:
            acceptance = Acceptance(accepted=counters["accepted_tokens"],
                                    steps=counters[str(how["steps"])],
                                    drafted=counters["draft_tokens"], source=str(how["source"]))
        except KeyError as exc:
            raise FrameworkError(f"{where}: acceptance needs the metric {exc}") from None
    spec = _mapping(data["speculative"], f"{where}: speculative")
    return FrameworkEntry(
        name=name, order=int(data["order"]),
        argv_words=_strings(data["argv_words"], f"{where}: argv_words"),
        programs=_strings(data["programs"], f"{where}: programs"),
        aliases=_strings(data.get("aliases", []), f"{where}: aliases"),
        options_file=bool(data.get("options_file", False)),
        data_parallel_attention=bool(data.get("data_parallel_attention", False)),
        dp_attention_needs_dp=bool(data.get("dp_attention_needs_dp", False)),
        persona=str(data["persona"]), metrics=metrics,
        latency_histograms={k: str(v) for k, v in _mapping(
            data.get("latency_histograms"), f"{where}: latency_histograms").items()},
        older_kv_usage=_strings(data.get("older_kv_usage", []), f"{where}: older_kv_usage"),
        acceptance=acceptance,
        debug_stats=str(data["debug_stats"]) if data.get("debug_stats") else None,
        speculative_reader=str(spec["reader"]) if spec.get("reader") else None,
        speculative_flags=_strings(spec.get("flags", []), f"{where}: speculative.flags"),
        synthetic_acceptance=_strings(spec.get("synthetic_acceptance", []),
                                      f"{where}: speculative.synthetic_acceptance"),
        router=str(data.get("router", "round-robin")),
        multinode={k: str(v) for k, v in _mapping(
            data.get("multinode"), f"{where}: multinode").items()},
        simulator=_mapping(data["simulator"], f"{where}: simulator"),
        kv_offload=_kv_offload(data.get("kv_offload"), f"{where}: kv_offload"),
        prefix_caching_off=_strings(data.get("prefix_caching_off", []),
                                    f"{where}: prefix_caching_off"))


def _kv_offload(value: object, where: str) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for backend, how in _mapping(value, where).items():
        how = _mapping(how, f"{where}.{backend}")
        unknown = set(how) - {"args", "env", "drop"}
        if unknown:
            raise FrameworkError(f"{where}.{backend}: unknown key {sorted(unknown)[0]!r} "
                                 "(expected args, env, drop)")
        env = _mapping(how.get("env"), f"{where}.{backend}.env")
        out[backend] = {"args": _strings(how.get("args", []), f"{where}.{backend}.args"),
                        "env": {str(k): str(v) for k, v in env.items()},
                        "drop": _strings(how.get("drop", []), f"{where}.{backend}.drop")}
    return out


def _all() -> dict[str, FrameworkEntry]:
    if not _packaged:
        folder = resources.files(__package__).joinpath(ENTRIES)
        for path in sorted(folder.iterdir(), key=lambda p: p.name):
            if path.name.endswith(".yaml"):
                found = entry(yaml.safe_load(path.read_text(encoding="utf-8")),
                              f"frameworks/{ENTRIES}/{path.name}")
                _packaged[found.name] = found
    return {**_packaged, **_registered}


def register(data: Mapping[str, Any]) -> FrameworkEntry:
    """Add (or replace) a framework for this process; returns its entry."""
    found = entry(data)
    _registered[found.name] = found
    return found


def unregister(name: str) -> None:
    _registered.pop(name, None)


def frameworks() -> tuple[FrameworkEntry, ...]:
    """Every framework, in `order`."""
    return tuple(sorted(_all().values(), key=lambda f: (f.order, f.name)))


def names() -> list[str]:
    return sorted(_all())


def get(name: str) -> FrameworkEntry:
    """A framework by name, case folded; `FrameworkError` lists the known ones."""
    table = _all()
    found = table.get(name) or {k.lower(): v for k, v in table.items()}.get(name.lower())
    if found is None:
        raise FrameworkError(f"unknown framework {name!r}; known: {', '.join(sorted(table))}")
    return found


def metric_labels() -> frozenset[str]:
    """The labels some framework's metric names select a series by: a scrape keeps those
    series apart as well as summing them."""
    return frozenset(label[0] for f in frameworks() for name in f.metrics.values()
                     if (label := split_metric(name)[1]) is not None)


def personas() -> tuple[str, ...]:
    """The frameworks whose own metric names the simulated server can expose."""
    return tuple(f.name for f in frameworks() if f.persona == f.name)


def of_argv(argv: Sequence[str]) -> FrameworkEntry | None:
    """The framework a launch argv starts, from its first words (program, module, model)."""
    words = " ".join(argv[:8]).lower()
    return next((f for f in frameworks() if any(w in words for w in f.argv_words)), None)


def engine_of(framework: str) -> str:
    """The engine a recipe framework runs: `dynamo-trt` -> trt, `sglang-disagg` -> sglang; a
    name the registry does not know comes back stripped, for the caller to report."""
    for found in frameworks():
        if framework in found.multinode:
            return found.name
    # A deployment no entry lists still names its engine, as InferenceX's framework names do.
    name = framework.removeprefix("dynamo-").removesuffix("-disagg")
    by_alias = {alias: f.name for f in frameworks() for alias in (f.name, *f.aliases)}
    return by_alias.get(name, name)


def default_router(framework: str) -> str:
    """The router policy InferenceX's deployment of a recipe framework (or of an engine's own
    disaggregation) runs by default."""
    for found in frameworks():
        if framework in found.multinode:
            return found.multinode[framework]
    own = _all().get(framework)
    return own.router if own is not None else "round-robin"
