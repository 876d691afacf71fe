"""Per-request records and the formulas that turn them into benchmark metrics.

One module for every backend: the HTTP client and the simulator's virtual-time driver both
produce `RequestRecord`s, and `summarize()` computes the vLLM `benchmark_serving` keys from them,
plus per-token ITL, token accounting, failures and the InferenceX aggregate keys.

Formulas (vLLM `calculate_metrics`, InferenceX `process_result.py`):

- TTFT = first content chunk - send; E2EL = last content chunk - send (the usage chunk and
  `[DONE]` are not part of latency).
- TPOT = (E2EL - TTFT) / (output_tokens - 1), only for requests with more than one output token;
  goodput treats the TPOT of shorter requests as 0, as vLLM does.
- ITL (vLLM) = one sample per chunk gap; per-token ITL = each gap divided over the tokens its chunk
  carried, one sample per token (token-weighted), so speculative chunks do not inflate it.
- Statistics: mean, median, population std (ddof 0), `np.percentile` with linear interpolation.
- Throughputs divide by the benchmark duration; input tokens count successful requests only.
- InferenceX: every `*_ms` key also appears in seconds without the suffix, every TPOT key also as
  interactivity `*_intvty` = 1000 / tpot_ms, and per-GPU throughputs divide by `num_gpus`
  (`catalog.derived_values`, `catalog.per_gpu`: the agg file derives them the same way).

Which distributions are computed, from which samples, with which percentiles, is the metric
catalog's (`catalog.py`); this module counts the chunk gaps (ITL, per-token ITL) and the
scalars.

Empty inputs never divide by zero: latency statistics over no samples are 0.0 (vLLM's `or 0`);
a throughput over a non-positive duration is 0.0; an interactivity whose TPOT is 0 is None
(InferenceX would raise); `request_goodput:` is None unless SLOs are given.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from . import catalog
from .catalog import ITL, PER_TOKEN_ITL
from .record import to_float
from .request_records import Flat, RequestRecord, StepRecords, first_send, flatten, send_times
from .sample_stats import latency_stats, weighted_stats

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from .record import JSONValue

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
# The per-request type lives in `request_records`; its importers have always found it here.
__all__ = ["RequestRecord", "StepRecords", "first_send", "summarize"]

NO_CHUNK_ERROR = "succeeded without any content chunk"


def _rate(amount: float, duration_s: float) -> float:
    return amount / duration_s if duration_s > 0 else 0.0


def _send_rate(records: Sequence[RequestRecord]) -> float | None:
    """Requests sent per second between the first and the last send (None below two sends)."""
    sends = send_times(records)
    span = float(sends.max() - sends.min()) if len(sends) > 1 else 0.0
    return (len(sends) - 1) / span if span > 0 else None


def _chunk_gaps(flat: Flat) -> tuple[FloatArray, FloatArray, IntArray]:
    """The chunk ITL samples, the per-token ITL samples and their token weights (seconds),
    when the chunk times are kept."""
    if flat.times is not None and flat.times.size > 1:
        starts = np.cumsum(flat.chunk_count) - flat.chunk_count
        gaps = np.diff(flat.times)
        within = np.ones(gaps.size, dtype=bool)
        within[starts[1:] - 1] = False  # the step from one request's last chunk to the next's first
        gaps = gaps[within]
        gap_tokens = (flat.tokens[1:][within] if flat.tokens is not None
                      else np.ones(gaps.size, np.int64))
    else:
        gaps, gap_tokens = np.zeros(0, np.float64), np.zeros(0, np.int64)
    # A chunk without tokens cannot split its gap over anything; its weight 0 drops it.
    if gap_tokens.size and int(gap_tokens.min()) > 0:
        per_token = gaps / gap_tokens
    else:
        per_token = np.divide(gaps, gap_tokens, out=np.zeros_like(gaps), where=gap_tokens > 0)
    return gaps, per_token, gap_tokens


def _itl_by_step(flat: Flat, ends: FloatArray, firsts: IntArray, percentiles: Sequence[float]
                 ) -> dict[str, float]:
    """Chunk and per-token ITL statistics from per-step counts: a gap ending at step t is
    ends[t] - ends[t-1] for every request (the very difference of its chunk times), so the
    distinct values are one per step, counted, never one per chunk sorted."""
    gap = np.diff(ends)  # gap[t - 1] ends at step t
    n = len(ends)
    # Each request's gaps end at steps first + 1 .. first + chunks - 1.
    per_step = np.cumsum(np.bincount(firsts + 1, minlength=n + 1)
                         - np.bincount(firsts + flat.chunk_count, minlength=n + 1))[1:n]
    out = weighted_stats(gap, per_step, ITL, percentiles)
    if flat.tokens is None or not flat.tokens.size or int(flat.tokens.max()) == 1:
        out.update({key.replace("_itl_ms", f"_{PER_TOKEN_ITL}_ms"): value
                    for key, value in out.items()})
        return out
    # Per token: one value per (step, tokens of the chunk) pair, weighted by its tokens. Each
    # chunk's key is its step * width + its tokens, built in place; a request's first chunk
    # ends no gap, so its key is counted out again.
    starts = np.cumsum(flat.chunk_count) - flat.chunk_count
    width = int(flat.tokens.max()) + 1
    keys = np.repeat((firsts - starts) * width, flat.chunk_count)
    keys += np.arange(0, flat.tokens.size * width, width)
    keys += flat.tokens
    pairs = (np.bincount(keys, minlength=n * width)
             - np.bincount(keys[starts], minlength=n * width))
    seen = np.nonzero(pairs)[0]
    at, tokens = np.divmod(seen, width)
    keep = tokens > 0  # a chunk without tokens cannot split its gap (weight 0)
    at, tokens = at[keep], tokens[keep]
    out.update(weighted_stats(gap[at - 1] / tokens, pairs[seen][keep] * tokens,
                               PER_TOKEN_ITL, percentiles))
    return out


def _goodput(flat: Flat, samples: Mapping[str, FloatArray], slos_ms: Mapping[str, float]
             ) -> int:
    allowed = catalog.goodput_metrics()
    unknown = sorted(set(slos_ms) - set(allowed))
    if unknown:
        raise ValueError(f"goodput SLO for {', '.join(unknown)}: expected "
                         f"{', '.join(allowed)} (ms)")
    # One value per request: a request of one token has no TPOT sample; vLLM counts it as 0.
    tpot = np.zeros_like(flat.send)
    tpot[flat.output_tokens > 1] = samples["tpot"]
    good = np.ones(flat.send.size, dtype=bool)
    for metric, limit_ms in slos_ms.items():
        values = tpot if metric == "tpot" else samples[metric]
        good &= values <= limit_ms / 1000.0
    return int(good.sum())


def inferencex_keys(summary: Mapping[str, JSONValue], num_gpus: int
                    ) -> dict[str, float | None]:
    """The keys InferenceX `process_result.py` derives (single node: GPUs = TP)."""
    out: dict[str, float | None] = dict(catalog.per_gpu(
        to_float(summary["total_token_throughput"]), to_float(summary["output_throughput"]),
        num_gpus))
    out.update(catalog.derived_values(summary))
    return out


def group_errors(records: Iterable[RequestRecord]) -> dict[str, int]:
    """Failure reasons with their counts, most frequent first."""
    counts = Counter(r.error or "unknown error" for r in records)
    return dict(counts.most_common())


def summarize(
    records: Sequence[RequestRecord],
    *,
    duration_s: float,
    num_prompts: int,
    max_concurrency: int,
    num_gpus: int,
    percentiles: Sequence[float] | None = None,
    goodput_slos: Mapping[str, float] | None = None,
) -> dict[str, JSONValue]:
    """The vLLM `benchmark_serving` result keys and the InferenceX aggregates for one point.

    `goodput_slos` maps ttft/tpot/e2el to a limit in ms; a request is good when it meets all.
    `percentiles` replaces every distribution's own (the catalog's).
    A record that claims success without any content chunk counts as failed.
    """
    if isinstance(records, StepRecords):  # all succeeded, each with its chunks
        ok: Sequence[RequestRecord] = records
        failed_records: list[RequestRecord] = []
    else:
        ok = [r for r in records if r.success and len(r.chunk_times)]
        failed_records = [
            r if not r.success else RequestRecord(
                r.send_time, r.end_time, r.input_tokens, r.output_tokens, False,
                error=NO_CHUNK_ERROR)
            for r in records if not (r.success and len(r.chunk_times))
        ]
    flat = flatten(ok)
    step_ends, firsts = flat.step_ends, flat.first_steps
    # Each distribution's samples from its catalog entry; the chunk gaps counted here.
    dists = catalog.distributions()
    samples = {m.name: m.samples(flat) for m in dists if m.samples is not None}
    gaps, per_token, itl_weights = _chunk_gaps(flat)
    kept = {m.name: tuple(percentiles) if percentiles is not None else m.percentiles
            for m in dists}

    total_in = int(flat.input_tokens.sum())
    total_out = int(flat.output_tokens.sum())
    chunk_token_sums = flat.token_sums()
    mismatched = int(np.count_nonzero(chunk_token_sums != flat.output_tokens))
    total_chunks = int(flat.chunk_count.sum())

    summary: dict[str, JSONValue] = {
        "completed": len(ok),
        "failed": len(failed_records),
        "num_prompts": num_prompts,
        "max_concurrency": max_concurrency,
        "duration": duration_s,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": _rate(len(ok), duration_s),
        "request_goodput:": (
            _rate(_goodput(flat, samples, goodput_slos), duration_s) if goodput_slos else None),
        "output_throughput": _rate(total_out, duration_s),
        "total_token_throughput": _rate(total_in + total_out, duration_s),
    }
    for m in dists:
        if m.samples is not None:
            summary.update(latency_stats(samples[m.name], m.name, kept[m.name]))
        elif m.name == ITL and step_ends is None:
            summary.update(latency_stats(gaps, ITL, kept[ITL]))
    if step_ends is not None and firsts is not None:
        summary.update(_itl_by_step(flat, step_ends, firsts, kept[ITL]))
    elif itl_weights.size and bool(np.all(itl_weights == 1)):
        # One token per chunk: per-token ITL is the chunk ITL, already computed (no 2nd sort).
        summary.update({key.replace("_itl_ms", f"_{PER_TOKEN_ITL}_ms"): value
                        for key, value in list(summary.items()) if key.endswith("_itl_ms")})
    else:
        summary.update(weighted_stats(per_token, itl_weights, PER_TOKEN_ITL,
                                       kept[PER_TOKEN_ITL]))
    summary.update({
        "total_chunks": total_chunks,
        "mean_tokens_per_chunk": (
            float(chunk_token_sums.sum()) / total_chunks if total_chunks else 0.0),
        "errors": group_errors(failed_records),
        "chunk_token_total": int(chunk_token_sums.sum()),
        "token_mismatch_requests": mismatched,
        "token_accounting_ok": mismatched == 0,
        "achieved_concurrency": _rate(float(samples["e2el"].sum()), duration_s),
        "achieved_request_rate": _send_rate(records),
    })
    summary.update(inferencex_keys(summary, num_gpus))
    return summary
