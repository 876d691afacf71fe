"""Virtual-time driver: one benchmark point's closed-loop load against the engine.

It sends the point's `workload.Workload` -- the very requests, lengths and send offsets the
HTTP client sends -- as the InferenceX client would: first the warmup requests under the same
concurrency limit, excluded from the metrics; then the measured requests, C in flight, each
finish releasing the next send at that instant (or, in an open loop, each sent at its offset
once a slot is free). Times are virtual seconds from the start of the measured phase; every
token's time is the end of the engine step that produced it.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..frameworks import registry
from ..results.measurement import ENGINE_COUNTERS
from ..results.metrics import RequestRecord, StepRecords
from ..results.request_records import ONE_PER_CHUNK, chunk_token_sums
from .closed_loop import fits_whole, plan_closed_loop
from .engine import Engine
from .stretch import advance

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy.typing as npt

    from ..loadgen.workload import Requests, Workload
    from ..results.record import JSONValue
    from .config import EngineConfig
    from .engine import Trace
    from .state import EngineCounters

MAX_STRETCH = 1 << 20
Hashes = list[tuple[int, ...]]


def prompt_block_hashes(requests: Requests, block_size: int, template_tokens: int
                        ) -> Hashes | None:
    """Content hashes of each request's full prompt blocks, for the prefix cache; None when no
    prompt shares text with another (then there is nothing to reuse, and the load may be
    planned). A `prefix:` group's prompts share their first template + prefix tokens (the
    template counted at the head); a conversation's turn opens with the earlier turn's prompt.
    A block is shared only when all of it lies in the shared text: its hash stands for it
    and everything before it."""
    if not any(r.prefix_key is not None or r.follows is not None for r in requests):
        return None
    out: Hashes = []
    by_key: dict[int, tuple[int, ...]] = {}
    for r in requests:
        full = r.input_tokens // block_size
        if r.follows is not None and r.follows in by_key:
            head = by_key[r.follows]
        elif r.prefix_key is not None and r.prefix_tokens > 0:
            shared = (template_tokens + r.prefix_tokens) // block_size
            head = tuple(hash(("prefix", r.prefix_key, j)) for j in range(shared))
        else:
            head = ()
        head = head[:full]
        own = tuple(hash(("prompt", r.text_key, j)) for j in range(len(head), full))
        by_key[r.text_key] = head + own
        out.append(head + own)
    return out


@dataclass(frozen=True)
class SimulatedPoint:
    records: Sequence[RequestRecord]
    duration_s: float
    server_metrics: dict[str, JSONValue]
    busy_s: float = 0.0  # the measured steps' total duration (the rest the engine was idle)


class StepTimeline:
    """End time of every engine step, indexed by the engine's global step number."""

    def __init__(self) -> None:
        self.ends = np.zeros(4096)
        self.n = 0
        self.now = 0.0
        self.busy = 0.0  # the steps' total duration: `now` less the idle waits between them

    def extend(self, durations: npt.NDArray[np.float64]) -> None:
        k = len(durations)
        if k == 1 and self.n < len(self.ends):  # one step: no cumulative sum to take
            step = float(durations[0])
            self.busy += step
            self.now += step
            self.ends[self.n] = self.now
            self.n += 1
            return
        if self.n + k > len(self.ends):
            self.ends = np.concatenate([self.ends, np.zeros(max(len(self.ends), k))])
        ends = self.now + np.cumsum(durations)
        self.ends[self.n:self.n + k] = ends
        self.n += k
        self.busy += float(ends[-1]) - self.now
        self.now = float(ends[-1])


def _run_load(engine: Engine, clock: StepTimeline, isl: npt.NDArray[np.int64],
              osl: npt.NDArray[np.int64], arrivals: npt.NDArray[np.float64], concurrency: int,
              first_id: int, chains: list[list[int]] | None = None, plan: bool = True,
              hashes: Hashes | None = None) -> Finished:
    """Send request i when it is due and fewer than `concurrency` are in flight (the client's
    semaphore); returns the finished requests.

    The client sends at max(due time, when its semaphore slot freed); the engine sees the
    request at the next step boundary, as a server that queues it until its next iteration.
    A request sent at a step's end (its slot freed by that step's finish) misses the step that
    starts there: a running engine composes its next step the instant the last one ends, while
    the finish still has to reach the client and the new request come back. It joins the step
    after, as it does on the HTTP server (`server.engine_loop`); an idle engine takes it at once.
    """
    start = clock.now
    # Most loads are closed loops whose whole schedule is planned in step space; the rest run
    # step by step below (`closed_loop.py` says when): so do prompts that share blocks, as
    # what the prefix cache holds depends on the order of every admission and finish.
    hashes = hashes if engine.prefix_cache is not None else None
    planned = (plan_closed_loop(engine, isl, osl, arrivals, concurrency, chains)
               if plan and hashes is None else None)
    if planned is not None:
        durations, finished = planned
        clock.extend(durations)
        after = np.asarray(finished.sent_after, np.int64)
        sends = np.where(after < 0, start, clock.ends[np.maximum(after, 0)])
        return Finished(finished.index, sends.tolist(), finished.first_step, finished.chunks,
                     finished.scheduled, None, finished.broken, request_tokens=finished.tokens)
    # A chain (a conversation's turns) goes on in the slot its last request freed, as the
    # client's per-connection worker sends it; chains start in order as slots free up.
    chains = chains if chains is not None else [[i] for i in range(len(isl))]
    pending = deque(chain[0] for chain in chains)
    successor = {a: b for chain in chains for a, b in itertools.pairwise(chain)}
    sent: dict[int, tuple[int, float]] = {}
    slot_free_at = deque([start] * concurrency)  # FIFO semaphore: when each permit came back
    in_transit: list[int] = []  # sent at this step end: they reach the engine during the next

    def admit(i: int) -> None:
        engine.add_request(first_id + i, int(isl[i]), int(osl[i]),
                           block_hashes=hashes[i] if hashes is not None else ())

    def send_due() -> None:
        busy = engine.has_work()
        while pending and len(sent) < concurrency and start + arrivals[pending[0]] <= clock.now:
            i = pending.popleft()
            t_send = max(start + float(arrivals[i]), slot_free_at.popleft())
            sent[first_id + i] = (i, t_send)
            if busy and t_send >= clock.now:
                in_transit.append(i)
            else:
                admit(i)

    send_due()
    done: list[tuple[int, float, Trace]] = []  # (i, send time, trace) in finish order
    while pending or in_transit or engine.has_work():
        if not engine.has_work():
            if in_transit:  # an idle engine starts its next step when they arrive
                for i in in_transit:
                    admit(i)
                in_transit.clear()
                continue
            clock.now = max(clock.now, start + float(arrivals[pending[0]]))  # idle until due
            send_due()
            continue
        due = math.inf
        if pending and len(sent) < concurrency:
            due = start + float(arrivals[pending[0]]) - clock.now
        batch = advance(engine, 1 if in_transit else MAX_STRETCH, due)
        clock.extend(batch.durations)
        for i in in_transit:
            admit(i)
        in_transit.clear()
        for rid in batch.finished:
            i, t_send = sent.pop(rid)
            done.append((i, t_send, engine.pop_trace(rid)))
            slot_free_at.append(clock.now)
            if i in successor:
                pending.appendleft(successor[i])
        send_due()
    return Finished.of(done, engine.k > 0)


@dataclass(frozen=True)
class Finished:
    """The finished requests of a load in finish order, as columns: index, send time, the
    step whose end brought its first chunk (-1 where a preemption broke its steps: `steps`
    has them by position), its chunks, the step that first computed part of its prompt, and
    with drafts its tokens per chunk (None: one each)."""

    index: list[int]
    send: list[float]
    first_step: list[int]
    chunks: list[int]
    scheduled: list[int]
    tokens: list[npt.NDArray[np.int64]] | None
    steps: dict[int, npt.NDArray[np.int64]]
    # A planned load's tokens per chunk instead, request after request in request order.
    request_tokens: npt.NDArray[np.int64] | None = None

    @classmethod
    def of(cls, done: list[tuple[int, float, Trace]], drafting: bool) -> Finished:
        firsts: list[int] = []
        broken: dict[int, npt.NDArray[np.int64]] = {}
        for pos, (_, _, trace) in enumerate(done):
            steps = trace.steps
            first = int(steps[0])
            if steps[-1] - first + 1 != len(steps):  # preempted: not one run of steps
                first = -1
                broken[pos] = steps
            firsts.append(first)
        return cls([i for i, _, _ in done], [t for _, t, _ in done], firsts,
                   [len(trace.steps) for _, _, trace in done],
                   [trace.first_scheduled_step for _, _, trace in done],
                   [trace.tokens for _, _, trace in done] if drafting else None, broken)


def simulate_point(config: EngineConfig, workload: Workload,
                   engine: Engine | None = None, *, plan: bool = True,
                   warmup_shortcut: bool = True) -> SimulatedPoint:
    """Simulate one point; `engine` may be reused across points (its state must be idle).
    `plan=False` runs the engine step by step even where the closed loop could be planned;
    `warmup_shortcut=False` runs the warmup even where it leaves no trace."""
    engine = engine or Engine(config, keep_traces=True)
    engine.keep_traces = True
    engine.report_emitted = False  # the traces say it all
    isl, osl = workload.length_arrays
    concurrency = workload.concurrency
    bs, template = engine.block_size, workload.template_tokens
    warm_hashes = prompt_block_hashes(workload.warmup, bs, template)
    hashes = prompt_block_hashes(workload.requests, bs, template)
    warm = StepTimeline()
    if workload.warmup and warmup_shortcut and warm_hashes is None and _warmup_leaves_no_trace(
            engine, *workload.warmup_length_arrays, concurrency):
        # All it would change is where the acceptance stream stands: it draws the same.
        engine.draw_decode_plans(workload.warmup_length_arrays[1])
    elif workload.warmup:
        warm_isl, warm_osl = workload.warmup_length_arrays
        warm.n = engine.steps_done
        warm.ends = np.zeros(engine.steps_done + 4096)
        _run_load(engine, warm, warm_isl, warm_osl, np.zeros(len(warm_isl)), concurrency,
                  first_id=1 << 40, plan=plan, hashes=warm_hashes)
    # Peaks are for the measured phase only, like a scrape taken after the warmup.
    engine.counters_state.peak_usage = 0.0
    engine.counters_state.peak_waiting = 0
    before = engine.counters()
    clock = StepTimeline()
    clock.n = engine.steps_done
    clock.ends = np.zeros(engine.steps_done + 4096)
    open_loop = workload.send_offsets is not None
    arrivals = (np.asarray(workload.send_offsets, dtype=np.float64) if open_loop
                else np.zeros(len(isl)))
    done = _run_load(engine, clock, isl, osl, arrivals, concurrency, first_id=0,
                     chains=workload.chains() if workload.conversational else None, plan=plan,
                     hashes=hashes)
    after = engine.counters()
    ends = clock.ends
    records = finished_records(done, ends, isl, osl, arrivals if open_loop else None)
    sched = np.asarray(done.scheduled, np.int64)
    queue_s = np.where(sched > 0, ends[np.maximum(sched - 1, 0)], 0.0) - np.asarray(done.send)
    metrics = server_metrics(before, after, engine)
    metrics["mean_queue_time_ms"] = float(np.maximum(queue_s, 0).mean() * 1e3) if len(isl) else 0.0
    metrics["max_queue_time_ms"] = float(np.maximum(queue_s, 0).max() * 1e3) if len(isl) else 0.0
    return SimulatedPoint(records, clock.now, metrics, busy_s=clock.busy)


def finished_records(done: Finished, ends: npt.NDArray[np.float64],
                     isl: npt.NDArray[np.int64], osl: npt.NDArray[np.int64],
                     scheduled: npt.NDArray[np.float64] | None) -> Sequence[RequestRecord]:
    """The finished requests' records in send order: columns over the step timeline, or
    (where a preemption broke a request's run of steps) one record each."""
    n = len(done.index)
    if not done.steps:
        at = np.empty(n, np.int64)  # request i's position in finish order
        at[np.asarray(done.index, np.int64)] = np.arange(n)
        chunks = np.asarray(done.chunks, np.int64)[at]
        tokens = done.request_tokens
        if done.tokens is not None:
            per_request = done.tokens
            tokens = (np.concatenate([per_request[pos] for pos in at.tolist()]) if n
                      else np.zeros(0, np.int64))
        return StepRecords(
            send_time=np.asarray(done.send, np.float64)[at], input_tokens=isl[:n],
            output_tokens=osl[:n] if tokens is None else chunk_token_sums(tokens, chunks),
            first_step=np.asarray(done.first_step, np.int64)[at], chunks=chunks,
            step_ends=ends, tokens=tokens, scheduled_time=scheduled)
    records: list[RequestRecord | None] = [None] * n
    for pos, i in enumerate(done.index):
        first, count = done.first_step[pos], done.chunks[pos]
        times = ends[first:first + count] if first >= 0 else ends[done.steps[pos]]
        output_tokens, chunk_tokens = record_tokens(
            None if done.tokens is None else done.tokens[pos], count)
        records[i] = RequestRecord(
            send_time=done.send[pos], end_time=float(times[-1]), input_tokens=int(isl[i]),
            output_tokens=output_tokens, success=True, chunk_times=times,
            chunk_tokens=chunk_tokens,
            scheduled_time=None if scheduled is None else float(scheduled[i]),
            step_ends=ends, first_step=first)
    return [r for r in records if r is not None]


def _warmup_leaves_no_trace(engine: Engine, isl: npt.NDArray[np.int64],
                            osl: npt.NDArray[np.int64], concurrency: int) -> bool:
    """Whether a warmup on this idle engine would leave nothing behind that the measured phase
    sees (there is no prefix cache to warm) but the acceptance draws of its decode plans: no
    jitter stream to advance, every request admissible, and with speculative decoding as many
    as can run at once fit the KV cache whole, so none is ever preempted (a re-admission
    draws a new plan; without drafts there is nothing to draw)."""
    cfg = engine.config
    if cfg.jitter > 0 or engine.has_work() or not len(isl) or min(isl.min(), osl.min()) < 1:
        return False
    longest = int((isl + osl).max())
    if longest > cfg.max_model_len or -(-(longest + engine.k) // engine.block_size
                                        ) > engine.num_blocks:
        return False  # the engine rejects it: the warmup runs, and says why
    return not engine.k or fits_whole(engine, isl, osl, concurrency)


def record_tokens(tokens: npt.NDArray[np.int64] | None, chunks: int
                  ) -> tuple[int, npt.NDArray[np.int64]]:
    """A record's output tokens and chunk tokens from its tokens per chunk; None (no drafts)
    means one token per chunk, and the record keeps no per-chunk counts (an empty
    `chunk_tokens` says so), which spares the metrics a pass over every token."""
    if tokens is not None:
        return int(tokens.sum()), tokens
    return chunks, ONE_PER_CHUNK


def counter_deltas(before: EngineCounters, after: EngineCounters) -> dict[str, float]:
    """What one engine's counters say of the steps between two reads."""
    return {
        "prompt_tokens": after.prompt_tokens - before.prompt_tokens,
        "generation_tokens": after.generation_tokens - before.generation_tokens,
        "preemptions": after.preemptions - before.preemptions,
        "engine_steps": after.steps - before.steps,
        "max_kv_cache_usage": after.peak_kv_cache_usage,
        "max_num_requests_waiting": after.peak_num_requests_waiting,
    }


def server_metrics(before: EngineCounters, after: EngineCounters, engine: Engine
                   ) -> dict[str, JSONValue]:
    """What a scrape of the server's counters before and after the point would say."""
    drafts = after.spec_num_drafts - before.spec_num_drafts
    accepted = after.spec_num_accepted_tokens - before.spec_num_accepted_tokens
    out: dict[str, JSONValue] = {
        "source": ENGINE_COUNTERS,
        **counter_deltas(before, after),
        "kv_cache_capacity_tokens": engine.kv_capacity_tokens,
    }
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    if queries:  # prompts that share blocks looked the prefix cache up
        hits = after.prefix_cache_hits - before.prefix_cache_hits
        out.update({"prefix_cache_queries": queries, "prefix_cache_hits": hits,
                    "prefix_cache_hit_rate": hits / queries})
    if after.host_tier:
        out["kv_tiers"] = kv_tiers(before, after)
    if drafts:
        hist = [a - b for a, b in zip(after.spec_accepted_histogram,
                                      before.spec_accepted_histogram, strict=True)]
        out.update({
            "spec_num_drafts": drafts,
            "spec_num_draft_tokens": after.spec_num_draft_tokens - before.spec_num_draft_tokens,
            "spec_num_accepted_tokens": accepted,
            "spec_accepted_histogram": hist,
            "acceptance_length": 1.0 + accepted / drafts,
            "acceptance_rate": accepted / (drafts * engine.k),
        })
    return out


def kv_tiers(before: EngineCounters, after: EngineCounters) -> dict[str, JSONValue]:
    """The CPU-DRAM tier's numbers over the point, under the quantity names a scrape of a
    server with the tier reports them (`loadgen.scrape.kv_tiers`)."""
    out: dict[str, JSONValue] = {}
    for key in registry.KV_TIER_COUNTERS:
        if hasattr(after, key):
            out[key] = getattr(after, key) - getattr(before, key)
    for key in registry.KV_TIER_GAUGES:
        out[key] = getattr(after, key)
    out["hbm_hit_tokens"] = out["prefix_cache_hits"]
    out["dram_hit_tokens"] = out["host_cache_hits"]
    return out
