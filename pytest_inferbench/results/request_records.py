"""The per-request record, a point's records as columns, and their flattening into arrays.

`RequestRecord` is the one per-request type of every backend. A simulated point can hold
hundreds of thousands of requests whose chunks all arrived at engine step ends: `StepRecords`
keeps them as columns over one step timeline and builds a `RequestRecord` only for a reader
that asks for one, so the metrics (`flatten`) read the columns without an object per request.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


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
    # An agentic replay's warmup request (its primers and per-lane warmups): sent to bring the
    # server to its live state, left out of every agentic metric (`results/agentic.py`).
    warmup: bool = False

    def tokens_per_chunk(self) -> IntArray:
        """`chunk_tokens`, or one token per chunk where the record keeps no counts."""
        if len(self.chunk_tokens) == len(self.chunk_times):
            return self.chunk_tokens
        return np.ones(len(self.chunk_times), np.int64)


ONE_PER_CHUNK = np.zeros(0, np.int64)  # a record's empty chunk_tokens: one token per chunk


class StepRecords(Sequence[RequestRecord]):
    """Successful requests whose chunks arrived at the ends of consecutive engine steps:
    request i's chunks at the ends of steps `first_step[i]` .. `first_step[i] + chunks[i] - 1`
    of `step_ends`. `tokens` holds every chunk's tokens, request after request (None: one
    token per chunk). `step_ends` may lay several engines' timelines end to end (a multinode
    deployment's decode instances): a request's steps never cross from one to the next, so
    the difference across a seam is no gap of anyone's. Read-only; indexing builds the
    `RequestRecord`."""

    def __init__(self, *, send_time: FloatArray, input_tokens: IntArray,
                 output_tokens: IntArray, first_step: IntArray, chunks: IntArray,
                 step_ends: FloatArray, tokens: IntArray | None,
                 scheduled_time: FloatArray | None) -> None:
        n = len(send_time)
        if not all(len(a) == n for a in (input_tokens, output_tokens, first_step, chunks)):
            raise ValueError("StepRecords columns differ in length")
        if n and (int(chunks.min()) < 1 or int(first_step.min()) < 0
                  or int((first_step + chunks).max()) > len(step_ends)):
            raise ValueError("StepRecords chunks must lie on the step timeline")
        self.send_time, self.input_tokens, self.output_tokens = (send_time, input_tokens,
                                                                 output_tokens)
        self.first_step, self.chunks, self.step_ends = first_step, chunks, step_ends
        self.tokens, self.scheduled_time = tokens, scheduled_time
        self._token_starts: IntArray | None = None

    def __len__(self) -> int:
        return len(self.send_time)

    @overload
    def __getitem__(self, index: int) -> RequestRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[RequestRecord]: ...

    def __getitem__(self, index: int | slice) -> RequestRecord | list[RequestRecord]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = range(len(self))[index]  # negative indices, and IndexError past the end
        first, n = int(self.first_step[i]), int(self.chunks[i])
        times = self.step_ends[first:first + n]
        chunk_tokens = ONE_PER_CHUNK
        if self.tokens is not None:
            if self._token_starts is None:
                self._token_starts = np.cumsum(self.chunks) - self.chunks
            start = int(self._token_starts[i])
            chunk_tokens = self.tokens[start:start + n]
        return RequestRecord(
            send_time=float(self.send_time[i]), end_time=float(times[-1]),
            input_tokens=int(self.input_tokens[i]), output_tokens=int(self.output_tokens[i]),
            success=True, chunk_times=times, chunk_tokens=chunk_tokens,
            scheduled_time=(None if self.scheduled_time is None
                            else float(self.scheduled_time[i])),
            step_ends=self.step_ends, first_step=first)

    def __iter__(self) -> Iterator[RequestRecord]:
        return (self[i] for i in range(len(self)))


def send_times(records: Sequence[RequestRecord]) -> FloatArray:
    if isinstance(records, StepRecords):
        return records.send_time
    return np.fromiter((r.send_time for r in records), np.float64, len(records))


def first_send(records: Sequence[RequestRecord]) -> float:
    """The origin of a point's relative times (per-request lines, the client's stalls)."""
    return float(send_times(records).min()) if len(records) else 0.0


@dataclass(frozen=True)
class Flat:
    """The successful requests flattened into arrays (one row per request or per chunk)."""

    send: FloatArray
    output_tokens: IntArray
    input_tokens: IntArray
    chunk_count: IntArray
    first: FloatArray  # per request: its first chunk's time
    last: FloatArray  # per request: its last chunk's time
    times: FloatArray | None  # every chunk's time; None when ITLs are counted per step
    tokens: IntArray | None  # every chunk's tokens; None when every chunk carried one
    # Where the chunks arrived at step ends (`StepRecords`, or records sharing `step_ends`):
    # the shared step ends and each request's first step, so ITLs are counted per step.
    step_ends: FloatArray | None = None
    first_steps: IntArray | None = None

    def token_sums(self) -> IntArray:
        """Tokens per request, summed over its chunks (the client's cross-check)."""
        if self.tokens is None:
            return self.chunk_count
        return chunk_token_sums(self.tokens, self.chunk_count)


def chunk_token_sums(tokens: IntArray, chunk_count: IntArray) -> IntArray:
    """Tokens per request from every chunk's tokens, request after request, and each
    request's number of chunks."""
    if not tokens.size:
        return _empty_int()
    sums: IntArray = np.add.reduceat(tokens, np.cumsum(chunk_count) - chunk_count)
    return sums


def flatten(ok: Sequence[RequestRecord]) -> Flat:
    """Successful records (each with a content chunk) as arrays."""
    if isinstance(ok, StepRecords):
        at, per = ok.first_step, ok.chunks
        return Flat(send=ok.send_time, output_tokens=ok.output_tokens,
                    input_tokens=ok.input_tokens, chunk_count=per,
                    first=ok.step_ends[at], last=ok.step_ends[at + per - 1],
                    times=None, tokens=ok.tokens, step_ends=ok.step_ends, first_steps=at)
    n = len(ok)
    counts = np.fromiter((len(r.chunk_times) for r in ok), np.int64, n)
    times: FloatArray | None = None
    step_ends = _shared_steps(ok)
    firsts = (np.fromiter((r.first_step for r in ok), np.int64, n)
              if step_ends is not None else None)
    if step_ends is not None and firsts is not None:
        first, last = step_ends[firsts], step_ends[firsts + counts - 1]
    else:
        times = (np.concatenate([r.chunk_times for r in ok]).astype(np.float64, copy=False)
                 if n else _empty_float())
        ends = np.cumsum(counts)
        first, last = times[ends - counts], times[ends - 1]
    tokens: IntArray | None = None
    if any(len(r.chunk_tokens) for r in ok):
        tokens = np.concatenate([r.tokens_per_chunk() for r in ok]).astype(np.int64,
                                                                          copy=False)
    return Flat(
        send=np.fromiter((r.send_time for r in ok), np.float64, n),
        output_tokens=np.fromiter((r.output_tokens for r in ok), np.int64, n),
        input_tokens=np.fromiter((r.input_tokens for r in ok), np.int64, n),
        chunk_count=counts, first=first, last=last, times=times, tokens=tokens,
        step_ends=step_ends, first_steps=firsts)


def _shared_steps(ok: Sequence[RequestRecord]) -> FloatArray | None:
    """The step end times every record's chunks arrived at, if they all share one."""
    ends = ok[0].step_ends if ok else None
    if ends is None or any(r.step_ends is not ends or r.first_step < 0 for r in ok):
        return None
    return ends
