"""An agentic-coding point's metrics as InferenceX aggregates them (agentic.md §4.2, §5).

A pure function of the point's `RequestRecord`s and what the replay says of itself
(`ReplayMeta`): the in-process and the HTTP replay both hand over records, so both get the
same numbers. Each request is first seen as AIPerf reports it (`AiperfRequest`: ns stamps,
TTFT, request latency, ITL = (E2EL - TTFT) / (OSL - 1), usage token counts, error, phase);
`agentic_files` writes those same views as `profile_export.jsonl`, so InferenceX's own
aggregation reads what this module counted.

- Warmup requests are left out of every metric, errors out of the latency and throughput
  numbers (`request_accounting` counts both).
- Statistics are {mean, p50, p75, p90, p95, std}: linear-interpolation percentiles, population
  std. TPOT is the ITL; interactivity is the slow-tail inversion (`pXX = 1 / pXX(ITL)`, std
  of the per-request 1/ITL); E2E-normalized interactivity the same over E2EL/OSL.
- QPS: completions counted in 1 s windows from the first completion to the last.
- Throughput: token sums over the span from the first start to the last end of the profiled
  successes, per GPU divided by the server's GPUs.
- Validity (`validity`): InferenceX's gate (at least one completed request, error rate at
  most 0.10) and AIPerf's `submission_valid` reasons (duration, context overflows, a
  cancelled run -- the deadline, or a request that lost the server --, TTFT/ITL coverage of
  98 %).
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .record import JSONValue
    from .request_records import RequestRecord

STATS = ("mean", "p50", "p75", "p90", "p95", "std")
QPS_WINDOW_S = 1.0
# InferenceX's AIPERF_FAILED_REQUEST_THRESHOLD: the validator's limit, inclusive.
FAILED_REQUEST_THRESHOLD = 0.10
# AIPerf's AgentX rules (agentic.md §5.4).
MIN_SAFE_DURATION_S = 900.0
CONTEXT_OVERFLOW_RATE_LIMIT = 0.01
MIN_METRIC_COVERAGE = 0.98
# AIPERF_AGENTX_CONTEXT_OVERFLOW_SUBSTRINGS: an error body saying so ends its session.
CONTEXT_OVERFLOW_SUBSTRINGS = ("context length", "maximum context", "context_length_exceeded",
                               "prompt is too long")
ERROR_CATEGORY_CHARS = 120


@dataclass(frozen=True)
class ReplayMeta:
    """What the aggregate needs besides the records."""

    num_gpus: int
    clock_start: float  # the records' clock at `start_unix`
    start_unix: float  # wall-clock time of `clock_start`, for the ns stamps AIPerf writes
    duration_s: float  # the configured benchmark duration (no request is sent after it)
    hit_blocks: int = 0  # theoretical prefix-cache hits, trace blocks, over the requests sent
    total_blocks: int = 0
    cancelled: bool = False  # the replay was cut off (the point's deadline)
    fault: str = ""  # why the replay stopped early: a request lost the server (stall, crash)
    expected_output: tuple[int, ...] | None = None  # per record: the trace's recorded `out`

    def to_json(self) -> dict[str, JSONValue]:
        """What the point's files are written again from (not the per-record lengths)."""
        return {"num_gpus": self.num_gpus, "clock_start": self.clock_start,
                "start_unix": self.start_unix, "duration_s": self.duration_s,
                "hit_blocks": self.hit_blocks, "total_blocks": self.total_blocks,
                "cancelled": self.cancelled, "fault": self.fault}

    @classmethod
    def from_json(cls, data: Mapping[str, JSONValue]) -> ReplayMeta:
        def num(key: str) -> float:
            value = data.get(key)
            return float(value) if isinstance(value, (int, float)) else 0.0
        return cls(num_gpus=int(num("num_gpus")), clock_start=num("clock_start"),
                   start_unix=num("start_unix"), duration_s=num("duration_s"),
                   hit_blocks=int(num("hit_blocks")), total_blocks=int(num("total_blocks")),
                   cancelled=bool(data.get("cancelled")), fault=str(data.get("fault") or ""))


@dataclass(frozen=True)
class AiperfRequest:
    """One request as AIPerf's `profile_export.jsonl` has it (times in ns and ms)."""

    start_ns: int
    end_ns: int
    ttft_ms: float | None  # None: no content chunk
    latency_ms: float  # request latency: last content chunk (else the end) - send
    itl_ms: float | None  # None below two output tokens
    isl: int
    osl: int
    error: str  # "" for a success
    warmup: bool


def _ns(t: float, meta: ReplayMeta) -> int:
    return round(meta.start_unix * 1e9) + round((t - meta.clock_start) * 1e9)


def aiperf_request(r: RequestRecord, meta: ReplayMeta) -> AiperfRequest:
    """The one view of a record that both the aggregate and the written export use."""
    chunks = r.chunk_times
    ttft = (float(chunks[0]) - r.send_time) * 1000 if len(chunks) else None
    last = float(chunks[-1]) if len(chunks) else r.end_time
    latency = (last - r.send_time) * 1000
    itl = ((latency - ttft) / (r.output_tokens - 1)
           if ttft is not None and r.output_tokens > 1 else None)
    # A success that streamed no content is no error to AIPerf: it lacks a TTFT (`validity`'s
    # metric coverage counts it).
    error = "" if r.success else (r.error or "failed")
    return AiperfRequest(_ns(r.send_time, meta), _ns(r.end_time, meta), ttft, latency, itl,
                         r.input_tokens, r.output_tokens if not error else 0, error, r.warmup)


def error_category(message: str) -> str:
    """InferenceX's error category of an error message: its first line up to a colon."""
    lines = message.strip().splitlines()
    if not lines:
        return "unknown"
    return (lines[0].split(":", 1)[0] or "unknown")[:ERROR_CATEGORY_CHARS]


def _percentile(values: Sequence[float], p: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), p))


def stats(values: Sequence[float]) -> dict[str, float]:
    """{mean, p50, p75, p90, p95, std} of `values`; {} for none."""
    if not values:
        return {}
    out = {"mean": float(statistics.fmean(values))}
    out |= {f"p{p}": _percentile(values, p) for p in (50, 75, 90, 95)}
    out["std"] = float(statistics.pstdev(values)) if len(values) > 1 else 0.0
    return out


def inverted(source: dict[str, float], samples: Sequence[float]) -> dict[str, float]:
    """The slow-tail inversion: each statistic's reciprocal, std of the reciprocal samples."""
    out = {k: 1.0 / v for k, v in source.items() if k != "std" and v > 0}
    per_request = [1.0 / v for v in samples if v > 0]
    if per_request:
        out["std"] = float(statistics.pstdev(per_request)) if len(per_request) > 1 else 0.0
    return out


def qps(ends_ns: Sequence[int]) -> dict[str, JSONValue]:
    """Completions per second in 1 s windows from the first completion to the last."""
    if len(ends_ns) < 2:
        return {}
    ends = sorted(t / 1e9 for t in ends_ns)
    duration = ends[-1] - ends[0]
    if duration <= 0:
        return {}
    counts: list[float] = []
    current = ends[0]
    while current + QPS_WINDOW_S <= ends[-1]:  # the windows' edges accumulate, as InferenceX's
        counts.append((bisect.bisect_left(ends, current + QPS_WINDOW_S)
                       - bisect.bisect_left(ends, current)) / QPS_WINDOW_S)
        current += QPS_WINDOW_S
    values: dict[str, JSONValue] = dict(stats(counts)) if counts else {
        "mean": len(ends) / duration}
    return {"window_seconds": QPS_WINDOW_S, "samples": len(counts), **values}


def _latency(ok: Sequence[AiperfRequest]) -> dict[str, JSONValue]:
    ttfts = [q.ttft_ms / 1000 for q in ok if q.ttft_ms is not None and q.ttft_ms > 0]
    e2els = [q.latency_ms / 1000 for q in ok if q.latency_ms > 0]
    itls = [q.itl_ms / 1000 for q in ok if q.itl_ms is not None and q.itl_ms > 0]
    normalized = [q.latency_ms / 1000 / q.osl for q in ok if q.latency_ms > 0 and q.osl > 0]
    itl = stats(itls)
    norm = stats(normalized)
    return {"ttft": dict(stats(ttfts)), "e2el": dict(stats(e2els)), "itl": dict(itl),
            "tpot": dict(itl), "intvty": dict(inverted(itl, itls)),
            "e2e_norm_intvty": dict(inverted(norm, normalized))}


def _throughput(ok: Sequence[AiperfRequest], num_gpus: int) -> dict[str, JSONValue]:
    if not ok:
        return {}
    duration = (max(q.end_ns for q in ok) - min(q.start_ns for q in ok)) / 1e9
    if duration <= 0:
        return {}
    rates = {"input": sum(q.isl for q in ok) / duration,
             "output": sum(q.osl for q in ok) / duration}
    rates["total"] = rates["input"] + rates["output"]
    per_gpu: dict[str, JSONValue] = (
        {f"{k}_tput_tps": rates[k] / num_gpus for k in ("total", "output", "input")}
        if num_gpus > 0 else {})
    return {**{k: {"tokens_per_second": v} for k, v in rates.items()},
            "duration_seconds": duration, "per_gpu": per_gpu}


def accounting(views: Sequence[AiperfRequest]) -> dict[str, JSONValue]:
    """InferenceX's `request_accounting`: what was left out of the metrics, and why."""
    categories: dict[str, int] = {}
    for q in views:
        if q.error:
            category = error_category(q.error)
            categories[category] = categories.get(category, 0) + 1
    profiled = sum(1 for q in views if not q.error and not q.warmup)
    return {"records_total": len(views), "records_profiled": profiled,
            "records_dropped_total": len(views) - profiled,
            "records_warmup_dropped": sum(1 for q in views if q.warmup),
            "records_error_dropped": sum(1 for q in views if q.error),
            "error_categories": dict(categories)}


def validity(views: Sequence[AiperfRequest], meta: ReplayMeta) -> dict[str, JSONValue]:
    """InferenceX's gate over the profiling phase and AIPerf's `submission_valid` reasons."""
    measured = [q for q in views if not q.warmup]
    errors = sum(1 for q in measured if q.error)
    completed = len(measured)
    error_rate = errors / completed if completed else None
    overflows = sum(1 for q in measured
                    if any(s in q.error.lower() for s in CONTEXT_OVERFLOW_SUBSTRINGS))
    ok = [q for q in measured if not q.error]
    covered = sum(1 for q in ok if q.ttft_ms is not None and (q.osl < 2 or q.itl_ms is not None))
    coverage = covered / len(ok) if ok else 0.0
    reasons: list[JSONValue] = []
    if meta.duration_s < MIN_SAFE_DURATION_S:
        reasons.append(f"unsafe_override: benchmark duration {meta.duration_s:g} s < "
                       f"{MIN_SAFE_DURATION_S:g} s")
    if completed and overflows / completed > CONTEXT_OVERFLOW_RATE_LIMIT:
        reasons.append(f"context_overflow_rate_exceeded: {overflows}/{completed} responses "
                       f"> {CONTEXT_OVERFLOW_RATE_LIMIT:.0%}")
    why = (meta.fault if meta.fault else
           "the point's deadline cut the replay off" if meta.cancelled else
           f"error rate {errors}/{completed} > {FAILED_REQUEST_THRESHOLD:.0%}"
           if error_rate is not None and error_rate > FAILED_REQUEST_THRESHOLD else "")
    if why:
        reasons.append(f"run_cancelled: {why}")
    if coverage < MIN_METRIC_COVERAGE:
        reasons.append(f"insufficient_profile_metric_coverage: TTFT/ITL observed for "
                       f"{coverage:.1%} of {len(ok)} profiled requests < "
                       f"{MIN_METRIC_COVERAGE:.0%}")
    return {"successes": len(ok), "errors": errors, "completed": completed,
            "error_rate": error_rate, "context_overflow_count": overflows,
            "metric_coverage": coverage, "submission_valid": not reasons,
            "invalid_reasons": reasons}


def inferencex_failures(valid: Mapping[str, JSONValue],
                        threshold: float = FAILED_REQUEST_THRESHOLD) -> list[str]:
    """`validate_agentic_result.py`'s verdict on the counts of `validity` (empty: passes)."""
    completed, errors = valid.get("completed"), valid.get("errors")
    if not isinstance(completed, int) or not isinstance(errors, int) or completed <= 0:
        return ["agentic: completed zero requests in the profiling phase"]
    if errors / completed > threshold:
        return [f"agentic: request error rate {errors}/{completed} = {errors / completed:.3%} "
                f"> {threshold:.3%} (InferenceX's validate_agentic_result.py)"]
    return []


def aggregate(records: Sequence[RequestRecord], meta: ReplayMeta) -> dict[str, JSONValue]:
    """The point's agentic block: `request_metrics` and `request_accounting` as InferenceX's
    `process_agentic_result.py` makes them, and `validity`."""
    views = [aiperf_request(r, meta) for r in records]
    ok = [q for q in views if not q.error and not q.warmup]
    # The recorded lengths count only where they pair with the records one to one.
    expected = (meta.expected_output if meta.expected_output is not None
                and len(meta.expected_output) == len(views) else None)
    tokens: dict[str, JSONValue] = {
        "input": dict(stats([float(q.isl) for q in ok])),
        "output_actual": dict(stats([float(q.osl) for q in ok])),
        "output_expected": dict(stats([float(n) for n, q in zip(expected, views, strict=True)
                                       if not q.error and not q.warmup]) if expected else {}),
    }
    theoretical = meta.hit_blocks / meta.total_blocks if meta.total_blocks > 0 else None
    request_metrics: dict[str, JSONValue] = {
        "qps": qps([q.end_ns for q in ok]), "latency": _latency(ok), "tokens": tokens,
        "throughput": _throughput(ok, meta.num_gpus),
        "cache": {"theoretical_cache_hit_rate": theoretical},
    }
    # The server block's token totals when there is no server metrics export: unknown
    # without a profiled success.
    totals: dict[str, JSONValue] = {"prompt_tokens": sum(q.isl for q in ok) if ok else None,
                                    "generation_tokens": sum(q.osl for q in ok) if ok else None,
                                    "requests": len(ok)}
    return {"request_metrics": request_metrics, "request_accounting": accounting(views),
            "validity": validity(views, meta), "totals": totals, "replay": meta.to_json()}
