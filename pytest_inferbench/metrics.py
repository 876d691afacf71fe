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
  interactivity `*_intvty` = 1000 / tpot_ms, and per-GPU throughputs divide by `num_gpus`.

Empty inputs never divide by zero: latency statistics over no samples are 0.0 (vLLM's `or 0`);
a throughput over a non-positive duration is 0.0; an interactivity whose TPOT is 0 is None
(InferenceX would raise); `request_goodput:` is None unless SLOs are given.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .record import to_float
from .sample_stats import latency_stats, weighted_stats

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from .record import JSONValue

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
PER_TOKEN_ITL = "itl_per_token"
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
DEFAULT_PERCENTILES = (90.0, 99.0, 99.9)
NO_CHUNK_ERROR = "succeeded without any content chunk"


def _empty_float() -> FloatArray:
    return np.zeros(0, dtype=np.float64)


def _empty_int() -> IntArray:
    return np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class RequestRecord:
    """What one request did, on one clock (seconds; any origin, the same for all records).

    `chunk_times[i]` is the arrival time of the i-th streamed chunk that carried content
    (the first is the first token) and `chunk_tokens[i]` the number of tokens it carried
    (more than one under speculative decoding; empty means one token per chunk).
    `output_tokens` is the server's own count (usage.completion_tokens); the sum of
    `chunk_tokens` is the client's cross-check. `error` says why a request failed.
    """

    send_time: float
    end_time: float
    input_tokens: int
    output_tokens: int
    success: bool
    chunk_times: FloatArray = field(default_factory=_empty_float)
    chunk_tokens: IntArray = field(default_factory=_empty_int)
    error: str = ""
    token_source: str = ""  # how chunk_tokens were counted: "usage", "tokenizer", "words", ...
    request_id: str = ""  # the server's response id, to join client and server timelines
    scheduled_time: float | None = None  # open loop: when the schedule wanted it sent
    # When the client set out to send it; `send_time` is when the request was on the wire
    # (the same when the transport cannot tell). The gap is the client's own dispatch delay.
    dispatch_time: float | None = None
    # The simulator's: chunk i arrived at the end of engine step `first_step + i`, whose end
    # is `step_ends[first_step + i]` (one array for all records of a point), so ITLs are
    # counted per step instead of sorted per chunk. Elsewhere None.
    step_ends: FloatArray | None = None
    first_step: int = -1

    def tokens_per_chunk(self) -> IntArray:
        """`chunk_tokens`, or one token per chunk where the record keeps no counts."""
        if len(self.chunk_tokens) == len(self.chunk_times):
            return self.chunk_tokens
        return np.ones(len(self.chunk_times), np.int64)


def first_send(records: Sequence[RequestRecord]) -> float:
    """The origin of a point's relative times (per-request lines, the client's stalls)."""
    return min((r.send_time for r in records), default=0.0)


def _rate(amount: float, duration_s: float) -> float:
    return amount / duration_s if duration_s > 0 else 0.0


def _send_rate(records: Sequence[RequestRecord]) -> float | None:
    """Requests sent per second between the first and the last send (None below two sends)."""
    sends = [r.send_time for r in records]
    span = max(sends) - min(sends) if len(sends) > 1 else 0.0
    return (len(sends) - 1) / span if span > 0 else None


@dataclass(frozen=True)
class _Flat:
    """The successful requests flattened into arrays (one row per request or per chunk)."""

    send: FloatArray
    output_tokens: IntArray
    input_tokens: IntArray
    chunk_count: IntArray
    first: FloatArray  # per request: its first chunk's time
    last: FloatArray  # per request: its last chunk's time
    times: FloatArray | None  # every chunk's time; None when ITLs are counted per step
    tokens: IntArray | None  # every chunk's tokens; None when every chunk carried one

    @classmethod
    def of(cls, ok: Sequence[RequestRecord], step_ends: FloatArray | None,
           firsts: IntArray | None) -> _Flat:
        """`step_ends` and `firsts` (`_shared_steps`): chunk times are read off the steps
        instead of concatenated."""
        n = len(ok)
        counts = np.fromiter((len(r.chunk_times) for r in ok), np.int64, n)
        times: FloatArray | None = None
        if step_ends is not None and firsts is not None:
            first, last = step_ends[firsts], step_ends[firsts + counts - 1]
        else:
            times = (np.concatenate([r.chunk_times for r in ok]).astype(np.float64, copy=False)
                     if n else _empty_float())
            ends = np.cumsum(counts)
            first, last = times[ends - counts], times[ends - 1]
        tokens = None
        if any(len(r.chunk_tokens) for r in ok):
            tokens = np.concatenate([r.tokens_per_chunk() for r in ok]).astype(np.int64,
                                                                              copy=False)
        return cls(
            send=np.fromiter((r.send_time for r in ok), np.float64, n),
            output_tokens=np.fromiter((r.output_tokens for r in ok), np.int64, n),
            input_tokens=np.fromiter((r.input_tokens for r in ok), np.int64, n),
            chunk_count=counts, first=first, last=last, times=times, tokens=tokens)

    def token_sums(self) -> IntArray:
        """Tokens per request, summed over its chunks (the client's cross-check)."""
        if self.tokens is None:
            return self.chunk_count
        starts = np.cumsum(self.chunk_count) - self.chunk_count
        sums: IntArray = (np.add.reduceat(self.tokens, starts) if self.tokens.size
                          else _empty_int())
        return sums


def _latencies(flat: _Flat) -> tuple[dict[str, FloatArray], IntArray]:
    """Per-request TTFT/E2EL/TPOT and (when the chunk times are kept) the chunk and per-token
    ITL samples, in seconds."""
    ttft = flat.first - flat.send
    e2el = flat.last - flat.send
    multi = flat.output_tokens > 1
    tpot = (e2el[multi] - ttft[multi]) / (flat.output_tokens[multi] - 1)
    tpot_for_goodput = np.zeros_like(ttft)
    tpot_for_goodput[multi] = tpot

    if flat.times is not None and flat.times.size > 1:
        starts = np.cumsum(flat.chunk_count) - flat.chunk_count
        gaps = np.diff(flat.times)
        within = np.ones(gaps.size, dtype=bool)
        within[starts[1:] - 1] = False  # the step from one request's last chunk to the next's first
        gaps = gaps[within]
        gap_tokens = (flat.tokens[1:][within] if flat.tokens is not None
                      else np.ones(gaps.size, np.int64))
    else:
        gaps, gap_tokens = _empty_float(), _empty_int()
    # A chunk without tokens cannot split its gap over anything; its weight 0 drops it.
    if gap_tokens.size and int(gap_tokens.min()) > 0:
        per_token = gaps / gap_tokens
    else:
        per_token = np.divide(gaps, gap_tokens, out=np.zeros_like(gaps), where=gap_tokens > 0)
    return {
        "ttft": ttft, "e2el": e2el, "tpot": tpot, "tpot_for_goodput": tpot_for_goodput,
        "itl": gaps, PER_TOKEN_ITL: per_token,
    }, gap_tokens


def _shared_steps(ok: Sequence[RequestRecord]) -> FloatArray | None:
    """The step end times every record's chunks arrived at, if they all share one."""
    ends = ok[0].step_ends if ok else None
    if ends is None or any(r.step_ends is not ends or r.first_step < 0 for r in ok):
        return None
    return ends


def _itl_by_step(flat: _Flat, ends: FloatArray, firsts: IntArray, percentiles: Sequence[float]
                 ) -> dict[str, float]:
    """Chunk and per-token ITL statistics from per-step counts: a gap ending at step t is
    ends[t] - ends[t-1] for every request (the very difference of its chunk times), so the
    distinct values are one per step, counted, never one per chunk sorted."""
    gap = np.diff(ends)  # gap[t - 1] ends at step t
    n = len(ends)
    # Each request's gaps end at steps first + 1 .. first + chunks - 1.
    per_step = np.cumsum(np.bincount(firsts + 1, minlength=n + 1)
                         - np.bincount(firsts + flat.chunk_count, minlength=n + 1))[1:n]
    out = weighted_stats(gap, per_step, "itl", percentiles)
    if flat.tokens is None or not flat.tokens.size or int(flat.tokens.max()) == 1:
        out.update({key.replace("_itl_ms", f"_{PER_TOKEN_ITL}_ms"): value
                    for key, value in out.items()})
        return out
    # Per token: one value per (step, tokens of the chunk) pair, weighted by its tokens.
    starts = np.cumsum(flat.chunk_count) - flat.chunk_count
    step = np.arange(flat.tokens.size) + np.repeat(firsts - starts, flat.chunk_count)
    within = np.ones(flat.tokens.size, dtype=bool)
    within[starts] = False
    width = int(flat.tokens.max()) + 1
    pairs = np.bincount(step[within] * width + flat.tokens[within], minlength=n * width)
    seen = np.nonzero(pairs)[0]
    at, tokens = np.divmod(seen, width)
    keep = tokens > 0  # a chunk without tokens cannot split its gap (weight 0)
    at, tokens = at[keep], tokens[keep]
    out.update(weighted_stats(gap[at - 1] / tokens, pairs[seen][keep] * tokens,
                               PER_TOKEN_ITL, percentiles))
    return out


def _goodput(lat: Mapping[str, FloatArray], slos_ms: Mapping[str, float]) -> int:
    unknown = sorted(set(slos_ms) - set(GOODPUT_METRICS))
    if unknown:
        raise ValueError(f"goodput SLO for {', '.join(unknown)}: expected ttft, tpot or e2el (ms)")
    good = np.ones(lat["ttft"].size, dtype=bool)
    for metric, limit_ms in slos_ms.items():
        values = lat["tpot_for_goodput"] if metric == "tpot" else lat[metric]
        good &= values <= limit_ms / 1000.0
    return int(good.sum())


def inferencex_keys(summary: Mapping[str, JSONValue], num_gpus: int
                    ) -> dict[str, float | None]:
    """The keys InferenceX `process_result.py` derives (single node: GPUs = TP)."""
    out: dict[str, float | None] = {}
    total = to_float(summary["total_token_throughput"])
    output = to_float(summary["output_throughput"])
    gpus = max(num_gpus, 1)
    out["tput_per_gpu"] = total / gpus
    out["output_tput_per_gpu"] = output / gpus
    out["input_tput_per_gpu"] = (total - output) / gpus
    for key, value in summary.items():
        if not key.endswith("ms") or not isinstance(value, (int, float)):
            continue
        seconds_key = key.replace("_ms", "")
        out[seconds_key] = value / 1000.0
        if "tpot" in key:
            out[seconds_key.replace("tpot", "intvty")] = 1000.0 / value if value else None
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
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    goodput_slos: Mapping[str, float] | None = None,
) -> dict[str, JSONValue]:
    """The vLLM `benchmark_serving` result keys and the InferenceX aggregates for one point.

    `goodput_slos` maps ttft/tpot/e2el to a limit in ms; a request is good when it meets all.
    A record that claims success without any content chunk counts as failed.
    """
    ok = [r for r in records if r.success and len(r.chunk_times)]
    failed_records = [
        r if not r.success else RequestRecord(
            r.send_time, r.end_time, r.input_tokens, r.output_tokens, False, error=NO_CHUNK_ERROR)
        for r in records if not (r.success and len(r.chunk_times))
    ]
    step_ends = _shared_steps(ok)
    firsts = (np.fromiter((r.first_step for r in ok), np.int64, len(ok))
              if step_ends is not None else None)
    flat = _Flat.of(ok, step_ends, firsts)
    lat, itl_weights = _latencies(flat)

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
            _rate(_goodput(lat, goodput_slos), duration_s) if goodput_slos else None),
        "output_throughput": _rate(total_out, duration_s),
        "total_token_throughput": _rate(total_in + total_out, duration_s),
    }
    for metric in LATENCY_METRICS:
        if step_ends is None or metric != "itl":
            summary.update(latency_stats(lat[metric], metric, percentiles))
    if step_ends is not None and firsts is not None:
        summary.update(_itl_by_step(flat, step_ends, firsts, percentiles))
    elif itl_weights.size and bool(np.all(itl_weights == 1)):
        # One token per chunk: per-token ITL is the chunk ITL, already computed (no 2nd sort).
        summary.update({key.replace("_itl_ms", f"_{PER_TOKEN_ITL}_ms"): value
                        for key, value in list(summary.items()) if key.endswith("_itl_ms")})
    else:
        summary.update(weighted_stats(lat[PER_TOKEN_ITL], itl_weights, PER_TOKEN_ITL,
                                       percentiles))
    summary.update({
        "total_chunks": total_chunks,
        "mean_tokens_per_chunk": (
            float(chunk_token_sums.sum()) / total_chunks if total_chunks else 0.0),
        "errors": group_errors(failed_records),
        "chunk_token_total": int(chunk_token_sums.sum()),
        "token_mismatch_requests": mismatched,
        "token_accounting_ok": mismatched == 0,
        "achieved_concurrency": _rate(float(lat["e2el"].sum()), duration_s),
        "achieved_request_rate": _send_rate(records),
    })
    summary.update(inferencex_keys(summary, num_gpus))
    return summary
