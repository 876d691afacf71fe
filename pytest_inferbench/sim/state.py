"""The engine's state: per-request bookkeeping, numpy slot arrays, counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, overload

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class StepResult:
    duration_s: float
    emitted: list[tuple[int, int]]  # (request_id, tokens) incl. first tokens
    finished: list[int]


@dataclass(frozen=True)
class StepBatch:
    """One or more consecutive steps: their durations and who finished at the last one."""

    durations: npt.NDArray[np.float64]
    finished: list[int]


@dataclass
class Request:
    rid: int
    prompt_tokens: int
    max_tokens: int
    arrival_step: int
    first_scheduled: int = -1
    slot: int = -1
    generated: int = 0
    # Its prompt's KV cache arrives computed (from a prefill instance): its first admission
    # takes the blocks and samples the first token, computing nothing.
    kv_ready: bool = False
    # Content hashes of its prompt's full blocks (prefix caching; empty: nothing to share),
    # and how many leading ones it holds through the prefix cache in its current admission.
    block_hashes: tuple[int, ...] = ()
    held: int = 0
    segments: list[tuple[int, IntArray]] = field(default_factory=list)

    def add_segment(self, first_step: int, tokens: IntArray) -> None:
        self.segments.append((first_step, tokens))

    def trace_arrays(self) -> tuple[IntArray, IntArray]:
        if len(self.segments) == 1:
            first, tokens = self.segments[0]
            return np.arange(first, first + len(tokens), dtype=np.int64), tokens
        if not self.segments:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        steps = np.concatenate([np.arange(s, s + len(t), dtype=np.int64)
                                for s, t in self.segments])
        tokens = np.concatenate([t for _, t in self.segments])
        return steps, tokens


@dataclass(frozen=True)
class EngineCounters:
    """A snapshot of the engine's counters, named like the engines' own."""

    num_requests_running: int
    num_requests_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    peak_kv_cache_usage: float  # simulator extra: highest usage seen so far
    peak_num_requests_waiting: int  # simulator extra
    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    requests_finished: int
    steps: int
    spec_num_drafts: int
    spec_num_draft_tokens: int
    spec_num_accepted_tokens: int
    spec_accepted_histogram: tuple[int, ...]  # verify steps that accepted 0..k drafts
    prefix_cache_queries: int = 0  # prompt tokens of admissions that looked up the cache
    prefix_cache_hits: int = 0  # of those, tokens found cached (not computed)
    # The CPU-DRAM tier (`kv-offloading: dram`; `host_tier` False: none): prompt tokens looked
    # up there (those past the HBM hit), of those loaded back instead of computed; the tokens
    # it holds and can hold; the copies each way and their seconds at the host link's bandwidth.
    host_tier: bool = False
    host_cache_queries: int = 0
    host_cache_hits: int = 0
    host_tokens_used: int = 0
    host_tokens_total: int = 0
    offload_bytes_written: int = 0  # HBM -> DRAM
    offload_bytes_read: int = 0  # DRAM -> HBM
    offload_seconds_written: float = 0.0
    offload_seconds_read: float = 0.0

    @property
    def spec_accepted_per_pos(self) -> tuple[int, ...]:
        """Accepted drafts at position i (vLLM num_accepted_tokens_per_pos)."""
        h = self.spec_accepted_histogram
        return tuple(sum(h[i + 1:]) for i in range(len(h) - 1))

    @property
    def acceptance_length(self) -> float | None:
        if not self.spec_num_drafts:
            return None
        return 1.0 + self.spec_num_accepted_tokens / self.spec_num_drafts


@dataclass
class CounterState:
    """The mutable counters behind `EngineCounters`."""

    k: int
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    requests_finished: int = 0
    drafts: int = 0
    accepted: int = 0
    histogram: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    peak_usage: float = 0.0
    peak_waiting: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    host_queries: int = 0
    host_hits: int = 0

    @classmethod
    def zero(cls, k: int) -> CounterState:
        return cls(k=k, histogram=np.zeros(k + 1 if k else 0, dtype=np.int64))

    def note_usage(self, used: int, total: int, waiting: int) -> None:
        if total:
            self.peak_usage = max(self.peak_usage, used / total)
        self.peak_waiting = max(self.peak_waiting, waiting)

    def snapshot(self, *, open_histogram: IntArray, running: int, waiting: int,
                 blocks_used: int, blocks_total: int, steps: int) -> EngineCounters:
        return EngineCounters(
            num_requests_running=running, num_requests_waiting=waiting,
            kv_blocks_used=blocks_used, kv_blocks_total=blocks_total,
            peak_kv_cache_usage=self.peak_usage, peak_num_requests_waiting=self.peak_waiting,
            prompt_tokens=self.prompt_tokens, generation_tokens=self.generation_tokens,
            preemptions=self.preemptions, requests_finished=self.requests_finished,
            steps=steps, spec_num_drafts=self.drafts, spec_num_draft_tokens=self.drafts * self.k,
            spec_num_accepted_tokens=self.accepted,
            spec_accepted_histogram=tuple(int(x) for x in self.histogram + open_histogram),
            prefix_cache_queries=self.prefix_queries, prefix_cache_hits=self.prefix_hits,
            host_cache_queries=self.host_queries, host_cache_hits=self.host_hits)


@overload
def plan_draws(remaining: int, min_emit: int) -> int: ...
@overload
def plan_draws(remaining: IntArray, min_emit: int) -> IntArray: ...
def plan_draws(remaining: int | IntArray, min_emit: int) -> int | IntArray:
    """Acceptance draws of decode plans for `remaining` tokens each: every step emits at least
    `min_emit` tokens, so this many always suffice (at least one, as a plan is drawn even for
    none). One request's count is a Python int (it is drawn once per request)."""
    draws = -(-remaining // min_emit)
    if isinstance(draws, int):
        return max(draws, 1)
    counts: IntArray = np.maximum(draws, 1)
    return counts


def plan_sums(remaining: int, accepted: IntArray) -> tuple[int, IntArray, IntArray]:
    """A speculative decode plan's running sums: each step emits its accepted drafts plus one
    token, until `remaining` tokens are out. Returns (steps, accepted drafts and tokens
    emitted after each drawn step); only the first `steps` entries belong to the plan."""
    accepted_sums = accepted.cumsum()
    emitted = accepted_sums + np.arange(1, len(accepted) + 1)
    steps = int(emitted.searchsorted(remaining)) + 1 if remaining > 0 else 0
    return steps, accepted_sums, emitted


def decode_plan(remaining: int, accepted: IntArray) -> tuple[int, IntArray, IntArray]:
    """A speculative decode plan (`plan_sums`). Returns (steps, tokens emitted before each
    step, accepted drafts of each step); the last step's surplus drafts are accepted but not
    emitted."""
    steps, _, emitted = plan_sums(remaining, accepted)
    before: IntArray = np.zeros(steps, dtype=np.int64)
    before[1:] = emitted[:steps - 1]
    return steps, before, accepted[:steps]


class SlotTable:
    """The running set as parallel arrays, one row per slot (at most max_num_seqs rows)."""

    def __init__(self, capacity: int, k: int) -> None:
        self.k = k
        z = np.zeros(capacity, dtype=np.int64)
        self.rid = np.full(capacity, -1, dtype=np.int64)
        self.ctx, self.blocks, self.prefilled, self.target = z.copy(), z.copy(), z.copy(), z.copy()
        self.shared = z.copy()  # of `blocks`, those held through the prefix cache (not owned)
        self.p, self.plan_steps, self.first_step, self.gen = z.copy(), z.copy(), z.copy(), z.copy()
        self.decoding = np.zeros(capacity, dtype=bool)
        # Admission order of the running slots (a slot's number says nothing about it).
        self.order = [0] * capacity
        self._admissions = 0
        self._free = list(range(capacity - 1, -1, -1))
        # Speculative plans: cumulative emitted tokens and accepted drafts after j decode
        # steps of the current admission, and the accepted count of each step.
        self.width = 1
        self.cum = np.zeros((capacity, 1), dtype=np.int64)
        self.acc_cum = np.zeros((capacity, 1), dtype=np.int64)
        self.acc_raw = np.zeros((capacity, 1), dtype=np.int64)

    def admit(self, rid: int, target: int, generated: int) -> int:
        slot = self._free.pop()
        self.order[slot] = self._admissions
        self._admissions += 1
        self.rid[slot] = rid
        self.target[slot] = target
        self.gen[slot] = generated
        self.ctx[slot] = self.blocks[slot] = self.prefilled[slot] = self.shared[slot] = 0
        self.p[slot] = self.plan_steps[slot] = 0
        self.decoding[slot] = False
        return slot

    def free(self, slot: int) -> None:
        self.rid[slot] = -1
        self.decoding[slot] = False
        self.blocks[slot] = self.shared[slot] = 0
        self._free.append(slot)

    def _grow(self, width: int) -> None:
        new = max(width, 2 * self.width)
        cap = len(self.rid)
        pad = new - self.width
        self.cum = np.concatenate([self.cum, np.zeros((cap, pad), dtype=np.int64)], axis=1)
        self.acc_cum = np.concatenate([self.acc_cum, np.zeros((cap, pad), dtype=np.int64)], axis=1)
        self.acc_raw = np.concatenate([self.acc_raw, np.zeros((cap, pad), dtype=np.int64)], axis=1)
        self.width = new

    def start_decode(self, slot: int, remaining: int, accepted: IntArray, first_step: int) -> None:
        """Plan the decode steps that emit `remaining` more tokens (accepted drafts per step)."""
        self.decoding[slot] = True
        self.first_step[slot] = first_step
        self.p[slot] = 0
        if not self.k:
            self.plan_steps[slot] = remaining
            return
        if not remaining:  # nothing left to plan (a prefill instance's requests)
            self.plan_steps[slot] = self.cum[slot, 0] = self.acc_cum[slot, 0] = 0
            return
        # Only columns 0..steps are ever read: p never passes plan_steps. The rows hold the
        # plan's running sums from 0 (`decode_plan`'s tokens before each step, then all).
        steps, accepted_sums, emitted = plan_sums(remaining, accepted)
        if steps + 1 > self.width:
            self._grow(steps + 1)
        self.plan_steps[slot] = steps
        cum, acc = self.cum[slot], self.acc_cum[slot]
        cum[0] = acc[0] = 0
        cum[1:steps] = emitted[:steps - 1]
        cum[steps] = remaining
        acc[1:steps + 1] = accepted_sums[:steps]
        self.acc_raw[slot, :steps] = accepted[:steps]

    def close_histogram(self, slot: int, c: CounterState) -> None:
        """Add this admission's accepted-count histogram to the counters (it is ending)."""
        if self.k:
            c.histogram += np.bincount(self.acc_raw[slot, :self.p[slot]], minlength=self.k + 1)

    def open_histogram(self, slots: IntArray) -> IntArray:
        """Accepted-count histogram of the decode steps of admissions still running."""
        hist = np.zeros(self.k + 1 if self.k else 0, dtype=np.int64)
        for slot in slots.tolist() if self.k else ():
            hist += np.bincount(self.acc_raw[slot, :self.p[slot]], minlength=self.k + 1)
        return hist

    def emitted_tokens(self, slot: int) -> IntArray:
        """Tokens of this admission: 1 at prefill completion, then each decode step's."""
        p = int(self.p[slot])
        if not self.k:
            return np.ones(p + 1, dtype=np.int64)
        row = self.cum[slot]
        tokens: IntArray = np.empty(p + 1, dtype=np.int64)
        tokens[0] = 1
        np.subtract(row[1:p + 1], row[:p], out=tokens[1:])
        return tokens

    def advance_decode(self, idx: IntArray, n: int, c: CounterState) -> IntArray:
        """Apply `n` decode steps to slots `idx`; returns tokens emitted per slot."""
        if not self.k:  # one token per step: scalar updates, no per-slot arrays
            self.ctx[idx] += n
            self.gen[idx] += n
            self.p[idx] += n
            c.generation_tokens += n * len(idx)
            return np.full(len(idx), n, dtype=np.int64)
        p0 = self.p[idx]
        p1 = p0 + n
        # Flat positions into the (slot, step) tables: `take` on them is cheaper than 2-D
        # fancy indexing with up to max_num_seqs slots a step.
        at0 = idx * self.width + p0
        at1 = at0 + n
        cum, acc_cum = self.cum.reshape(-1), self.acc_cum.reshape(-1)
        tokens: IntArray = cum.take(at1) - cum.take(at0)
        c.drafts += len(idx) * n
        c.accepted += int(acc_cum.take(at1).sum() - acc_cum.take(at0).sum())
        self.ctx[idx] += tokens
        self.gen[idx] += tokens
        self.p[idx] = p1
        c.generation_tokens += int(tokens.sum())
        return tokens
