"""The metric catalog: every metric of a point's record declared once.

A `Metric` says what a metric is (unit, which way is better, whether a clock measured it), how
it is computed (a distribution's per-request samples, or a derivation from another metric's
statistics), which statistics a distribution keeps, where InferenceX has it (the raw
`benchmark_serving` file or the `process_result.py` agg file), and where the plugin shows it:
JUnit properties, terminal table columns, plot axes, the metrics compared with a baseline by
default, the SLOs of `--inferbench-goodput`. Everyone asks the catalog: `metrics.summarize`
(which distributions to compute and what derives from them), `point_files` (the raw file's
latency keys, the agg file's derived keys), `report` (properties, columns, plots), `gates`
(units, directions, timings) and `options` (the goodput metrics).

Keys of a distribution named `x`: `<stat>_x_ms` (vLLM's statistics, in ms) and `<stat>_x` (the
same in seconds, as InferenceX adds them), stats being mean, median, std and `p<percentile>`.
A metric derived from a distribution has `<stat>_<its name>` for each of its source's stats.
A scalar metric is one key, its name.

`CATALOG` is read when asked, never copied at import, so a test may replace it with a longer
one: adding a metric is one declaration here (and the function that computes its samples).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .metric_kinds import (
    DEFAULT_PERCENTILES,
    MS_SUFFIX,
    Column,
    Direction,
    Fact,
    FloatArray,
    InferenceX,
    Metric,
    PlotAxis,
)

if TYPE_CHECKING:
    from .record import JSONValue
    from .request_records import Flat

# The one conversion of a statistic (InferenceX: every `*_ms` key also in seconds) and the one
# interactivity (1000 / TPOT in ms; None at TPOT 0, where InferenceX would divide by zero).
def seconds(ms: float) -> float:
    return ms / 1000.0


def interactivity(tpot_ms: float) -> float | None:
    return 1000.0 / tpot_ms if tpot_ms else None


def per_gpu(total_tput: float, output_tput: float, gpus: int) -> dict[str, float]:
    """InferenceX's per-GPU throughputs (a single node's GPUs are its TP)."""
    n = max(gpus, 1)
    return {"tput_per_gpu": total_tput / n, "output_tput_per_gpu": output_tput / n,
            "input_tput_per_gpu": (total_tput - output_tput) / n}


def _ttft(flat: Flat) -> FloatArray:
    return flat.first - flat.send


def _e2el(flat: Flat) -> FloatArray:
    return flat.last - flat.send


def _tpot(flat: Flat) -> FloatArray:
    multi = flat.output_tokens > 1
    # (E2EL - TTFT), not (last - first): the same float rounding as vLLM's formula.
    return ((_e2el(flat)[multi] - _ttft(flat)[multi])
            / (flat.output_tokens[multi] - 1))


ITL = "itl"
PER_TOKEN_ITL = "itl_per_token"
_TPUT = "tok/s"


def latency(name: str, title: str, *, samples: Callable[[Flat], FloatArray] | None = None,
            inferencex: InferenceX = "", junit: tuple[str, ...] = (),
            columns: tuple[Column, ...] = (), plot: tuple[PlotAxis, ...] = (),
            baseline: tuple[str, ...] = (), goodput: bool = False) -> Metric:
    """A latency distribution: seconds, lower is better, a timing, vLLM's percentiles."""
    return Metric(name, title, "s", Direction.LOWER, timing=True, samples=samples,
                  percentiles=DEFAULT_PERCENTILES, inferencex=inferencex, junit=junit,
                  columns=columns, plot=plot, baseline=baseline, goodput=goodput)


CATALOG: tuple[Metric | Fact, ...] = (
    *(Fact(name) for name in (
        "server_node", "config_key", "model_prefix", "hardware", "framework", "precision", "tp",
        "ep", "dp_attention", "spec_decoding", "isl", "osl", "agentic_traces", "conc",
        "kv_offloading", "request_rate",
        "rate_limited")),
    Metric("achieved_request_rate", "requests sent per second between the first and the "
           "last send (none below two sends)", "req/s", junit=("achieved_request_rate",)),
    Metric("achieved_concurrency", "requests in flight on average: the sum of the E2ELs "
           "over the duration", "", junit=("achieved_concurrency",),
           columns=(Column("in flight", "achieved_concurrency"),)),
    *(Fact(name) for name in (
        "backend", "time_scale", "timings_meaningful", "image", "simulated",
        "expected_error_label", "token_counts_estimated")),
    Metric("num_prompts", "requests of the point", "", inferencex="raw", junit=("num_prompts",)),
    Metric("max_concurrency", "requests the client keeps in flight at most", "",
           inferencex="raw"),
    Metric("completed", "requests that succeeded with at least one content chunk", "",
           Direction.HIGHER, inferencex="raw", junit=("completed",)),
    Metric("failed", "requests that failed", "", Direction.LOWER, junit=("failed",)),
    Metric("duration", "the benchmark's duration", "s", Direction.LOWER, timing=True,
           inferencex="raw", junit=("duration",)),
    Metric("total_input_tokens", "prompt tokens of the successful requests", "",
           inferencex="raw"),
    # Higher is better, as the baseline has always read it (its name holds "tput"); the
    # workload fixes it anyway.
    Metric("total_output_tokens", "output tokens of the successful requests (the server's "
           "usage counts)", "", Direction.HIGHER, inferencex="raw"),
    Metric("request_throughput", "successful requests per second", "req/s", Direction.HIGHER,
           timing=True, inferencex="raw", junit=("request_throughput",)),
    Metric("request_goodput:", "requests per second that met every goodput SLO (vLLM's key, "
           "colon included; null without SLOs)", "req/s", Direction.HIGHER, timing=True,
           inferencex="raw"),
    Metric("output_throughput", "output tokens per second", _TPUT, Direction.HIGHER,
           timing=True, inferencex="raw", junit=("output_throughput",)),
    Metric("total_token_throughput", "input and output tokens per second", _TPUT,
           Direction.HIGHER, timing=True, inferencex="raw", junit=("total_token_throughput",)),
    Metric("tput_per_gpu", "total token throughput per GPU", "tok/s/GPU", Direction.HIGHER,
           timing=True, inferencex="agg", junit=("tput_per_gpu",),
           columns=(Column("tput/GPU tok/s", "tput_per_gpu"),),
           plot=(PlotAxis("tput_per_gpu", "Throughput per GPU (tok/s/GPU)", "y"),),
           baseline=("tput_per_gpu",)),
    Metric("output_tput_per_gpu", "output token throughput per GPU", "tok/s/GPU",
           Direction.HIGHER, timing=True, inferencex="agg", junit=("output_tput_per_gpu",),
           columns=(Column("out tput/GPU tok/s", "output_tput_per_gpu"),),
           baseline=("output_tput_per_gpu",)),
    Metric("input_tput_per_gpu", "input token throughput per GPU", "tok/s/GPU",
           Direction.HIGHER, timing=True, inferencex="agg", junit=("input_tput_per_gpu",)),
    Metric("intvty", "interactivity: 1000 / TPOT in ms, per TPOT statistic", "tok/s/user",
           Direction.HIGHER, timing=True, derived_from="tpot", derive=interactivity,
           inferencex="agg", junit=("median_intvty", "p99_intvty"),
           columns=(Column("intvty tok/s/user", "median_intvty"),),
           plot=(PlotAxis("median_intvty", "Interactivity, median (tok/s/user)", "x"),),
           baseline=("median_intvty", "p99_intvty")),
    latency("ttft", "time to first token: first content chunk - send", samples=_ttft,
            inferencex="raw", junit=("median_ttft", "p99_ttft"),
            columns=(Column("TTFT p50 s", "median_ttft", digits=3),
                     Column("TTFT p99 s", "p99_ttft", digits=3)),
            baseline=("median_ttft", "p99_ttft"), goodput=True),
    latency("tpot", "time per output token: (E2EL - TTFT) / (output tokens - 1), requests of "
            "more than one token", samples=_tpot, inferencex="raw",
            junit=("median_tpot", "p99_tpot"),
            columns=(Column("TPOT p50 ms", "median_tpot", 1000.0, 2),), goodput=True),
    latency(ITL, "inter-token latency as vLLM counts it: one sample per gap between chunks",
            inferencex="raw", junit=("median_itl",)),
    latency("e2el", "end-to-end latency: last content chunk - send", samples=_e2el,
            inferencex="raw", junit=("median_e2el", "p99_e2el"),
            columns=(Column("E2EL p50 s", "median_e2el", digits=2),),
            plot=(PlotAxis("median_e2el", "End-to-end latency, median (s)", "x"),),
            baseline=("median_e2el", "p99_e2el"), goodput=True),
    latency(PER_TOKEN_ITL, "inter-token latency per token: each chunk gap divided over its "
            "tokens, token-weighted"),
    Metric("total_chunks", "content chunks streamed", ""),
    Metric("mean_tokens_per_chunk", "tokens per content chunk", ""),
    Metric("errors", "failure reasons and their counts, most frequent first", ""),
    Metric("chunk_token_total", "tokens counted over the chunks (the client's cross-check)", ""),
    Metric("token_mismatch_requests", "requests whose chunk tokens differ from their usage "
           "count", ""),
    Metric("token_accounting_ok", "no request's chunk tokens differ from its usage count", ""),
    Metric("acceptance_length", "speculative decoding's tokens per step, from the server's "
           "metrics", "", Direction.HIGHER, junit=("acceptance_length",),
           columns=(Column("AL (golden)", "acceptance_length", digits=2,
                           beside="golden_acceptance_length"),),
           baseline=("acceptance_length",)),
    Metric("client_tokens_per_chunk", "tokens per chunk as the client saw them (a speculative "
           "server's AL check)", ""),
    # A server's own latency histograms over the point (`server_latency.py`): the client's
    # median minus the server's median estimate, which is off by at most the width of the
    # bucket that holds it.
    Metric("client_minus_server_median_ttft_ms", "client median TTFT minus the server's "
           "(its TTFT histogram over the point, median interpolated in its bucket)", "ms",
           timing=True, junit=("client_minus_server_median_ttft_ms",)),
    Metric("client_minus_server_median_itl_ms", "client median ITL minus the server's "
           "(its inter-token latency histogram over the point)", "ms", timing=True,
           junit=("client_minus_server_median_itl_ms",)),
    *(Fact(name) for name in ("golden_acceptance_length", "synthetic_acceptance_length")),
    # GPU power (`results.power`): InferenceX's agg keys, the numbers only when power_valid is 1.
    Metric("power_valid", "1: the power keys hold numbers (GPU tool or model), else 0", "",
           inferencex="agg", junit=("power_valid",)),
    Metric("avg_power_w", "each GPU's mean power over the measured phase", "W", Direction.LOWER,
           inferencex="agg", junit=("avg_power_w",)),
    Metric("total_gpu_energy_j", "GPU energy: mean power x GPUs x duration", "J", Direction.LOWER,
           inferencex="agg"),
    Metric("joules_per_output_token", "GPU energy per output token", "J/tok", Direction.LOWER,
           inferencex="agg", junit=("joules_per_output_token",),
           columns=(Column("J/out tok", "joules_per_output_token", digits=3),)),
    Metric("joules_per_total_token", "GPU energy per input and output token", "J/tok",
           Direction.LOWER, inferencex="agg"),
    # An agentic point's InferenceX aggregate (`agentic.py`), its warmup left out; a table shows
    # their columns only where a point has them.
    Metric("p90_e2e_norm_intvty", "E2E-normalized interactivity: 1 / p90 of E2EL/OSL per "
           "request (AgentX's headline axis)", "tok/s/user", Direction.HIGHER, timing=True,
           junit=("p90_e2e_norm_intvty",), baseline=("p90_e2e_norm_intvty",),
           columns=(Column("E2E-norm intvty p90", "p90_e2e_norm_intvty", optional=True),),
           plot=(PlotAxis("p90_e2e_norm_intvty", "E2E-normalized interactivity, p90 "
                          "(tok/s/user)", "agentic-x"),)),
    Metric("agentic_p90_intvty", "AgentX interactivity: 1 / p90 of the per-request ITL, "
           "(E2EL - TTFT) / (OSL - 1) where above 0", "tok/s/user", Direction.HIGHER,
           timing=True, junit=("agentic_p90_intvty",), baseline=("agentic_p90_intvty",),
           columns=(Column("intvty p90 (AgentX)", "agentic_p90_intvty", optional=True),)),
    Metric("agentic_tput_per_gpu", "token throughput per GPU over the first start to last end "
           "of the profiled requests", "tok/s/GPU", Direction.HIGHER, timing=True,
           junit=("agentic_tput_per_gpu",), baseline=("agentic_tput_per_gpu",),
           columns=(Column("span tput/GPU tok/s", "agentic_tput_per_gpu", optional=True),),
           plot=(PlotAxis("agentic_tput_per_gpu", "Throughput per GPU, first start to last end "
                          "(tok/s/GPU)", "agentic-y"),)),
    Metric("mean_qps", "completions per second, mean over 1 s windows", "req/s",
           Direction.HIGHER, timing=True, junit=("mean_qps",)),
    Metric("submission_valid", "1 when AIPerf's AgentX rules hold (duration, overflows, not "
           "cancelled, metric coverage), else 0; `invalid_reasons` says why", "",
           Direction.HIGHER, junit=("submission_valid",),
           columns=(Column("valid", "submission_valid", digits=0, optional=True),)),
)


def metrics() -> tuple[Metric, ...]:
    return tuple(entry for entry in _checked() if isinstance(entry, Metric))


@dataclass(frozen=True)
class Key:
    """One record key of a metric: its unit ("ms" for a distribution's ms statistics)."""

    key: str
    metric: Metric
    unit: str


@functools.lru_cache(maxsize=4)  # keyed by the catalog itself: a replaced one is new
def _index(catalog: tuple[Metric | Fact, ...]) -> dict[str, Key]:
    """Every metric key -> its `Key`; a key shown (JUnit, column, plot, baseline) that is none
    of its metric's keys is refused here, at the first question asked of the catalog."""
    by_name = {m.name: m for m in catalog if isinstance(m, Metric)}
    index: dict[str, Key] = {}
    for m in by_name.values():
        source = by_name.get(m.derived_from)
        if m.derived_from and (source is None or not source.distribution):
            raise ValueError(f"metric {m.name}: derived from {m.derived_from!r}, "
                             "which is no distribution of the catalog")
        own = m.record_keys(source.percentiles if source else ())
        shown = [*m.junit, *(c.key for c in m.columns), *(a.key for a in m.plot), *m.baseline]
        stray = [key for key in shown if key not in own]
        if stray:
            raise ValueError(f"metric {m.name}: {', '.join(stray)} is none of its keys")
        for key in own:
            unit = "ms" if m.distribution and key.endswith(MS_SUFFIX) else m.unit
            index[key] = Key(key, m, unit)
    return index


@functools.lru_cache(maxsize=4)
def _derivations(catalog: tuple[Metric | Fact, ...]) -> dict[str, tuple[Metric, ...]]:
    """A distribution's name -> the metrics derived from its statistics."""
    found = [m for m in catalog if isinstance(m, Metric)]
    return {m.name: tuple(d for d in found if d.derived_from == m.name)
            for m in found if m.distribution}


def _checked() -> tuple[Metric | Fact, ...]:
    """The catalog, once its declarations have been checked (`_index`)."""
    _index(CATALOG)
    return CATALOG


def describe(key: str) -> Key | None:
    """The metric a record key belongs to (None: no metric's key)."""
    return _index(CATALOG).get(key)


def all_record_keys() -> tuple[str, ...]:
    """Every metric key a point's record may hold."""
    return tuple(_index(CATALOG))


def unit_of(key: str) -> str:
    found = describe(key)
    return found.unit if found else ""


def direction(key: str) -> Direction | None:
    found = describe(key)
    return found.metric.direction if found else None


def is_timing(key: str) -> bool:
    """A latency, rate or throughput (what a clock measured), as opposed to counts and ALs."""
    found = describe(key)
    return found is not None and found.metric.timing


def derived_values(values: Mapping[str, JSONValue]) -> dict[str, float | None]:
    """What derives from the distribution statistics among `values`, in their order: each
    `<stat>_<name>_ms` in seconds without the suffix, then each metric derived from it
    (`<stat>_intvty` from TPOT's). The summary and the agg file both ask this. Any statistic
    counts (`summarize` may be asked for other percentiles than a metric keeps)."""
    derivations = _derivations(CATALOG)
    out: dict[str, float | None] = {}
    for key, value in values.items():
        if not key.endswith(MS_SUFFIX) or isinstance(value, bool) or not isinstance(
                value, (int, float)):
            continue
        stat, _, name = key.removesuffix(MS_SUFFIX).partition("_")  # no stat holds a "_"
        derived = derivations.get(name)
        if derived is None:
            continue
        out[f"{stat}_{name}"] = seconds(value)
        for d in derived:
            assert d.derive is not None  # declared together (Metric.__post_init__)
            out[f"{stat}_{d.name}"] = d.derive(value)
    return out


def distributions() -> tuple[Metric, ...]:
    return tuple(m for m in metrics() if m.distribution)


def inferencex_raw_latency_keys() -> tuple[str, ...]:
    """benchmark_serving's latency keys: the ms statistics of its distributions, in order."""
    return tuple(key for m in distributions() if m.inferencex == "raw"
                 for key in m.record_keys() if key.endswith(MS_SUFFIX))


def junit_properties() -> tuple[str, ...]:
    return tuple(key for entry in _checked()
                 for key in ((entry.name,) if isinstance(entry, Fact) else entry.junit))


def columns() -> tuple[Column, ...]:
    return tuple(column for m in metrics() for column in m.columns)


def plot_axes() -> tuple[PlotAxis, ...]:
    return tuple(axis for m in metrics() for axis in m.plot)


def baseline_metrics() -> tuple[tuple[str, bool], ...]:
    """(key, higher is better) of the metrics compared with a baseline by default."""
    return tuple((key, m.direction is Direction.HIGHER)
                 for m in metrics() for key in m.baseline)


def goodput_metrics() -> tuple[str, ...]:
    return tuple(m.name for m in metrics() if m.goodput)
