"""The closed loop planned in step space: a whole load's schedule from per-request events.

In a closed loop with enough KV cache, which step each request is admitted, prefilled, decodes
and finishes in does not depend on how long the steps take: a finish frees a client slot, the
next request reaches the engine two steps later (one while it is in transit), its prefill
takes the steps the token budget allows, and its decode plan is drawn when the prefill ends.
So the engine's schedule can be replayed with one cheap Python event per admission and per
finish (`_Schedule`), and every step's aggregates (decoding sequences, context sums, prefill
terms, KV blocks held) built afterwards from per-request ranges with numpy, priced in one
`StepCost.step` call.

It follows `Engine.step`, `stretch.run_stretch` and `driver._run_load` rule for rule; where
an assumption fails (an open loop, conversations, the KV cache running short, decode beyond
the token budget) `plan_closed_loop` returns None before touching the engine and the driver
runs the engine step by step. `tests/sim/test_closed_loop.py` holds both paths to the same
figures.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from . import decode_sums
from .kv_schedule import plan_kv_limited
from .planned import PlannedFinishes, client_turn, commit, prefill_terms, price_steps
from .state import plan_draws

if TYPE_CHECKING:
    import numpy.typing as npt

    from .acceptance import AcceptanceSampler
    from .engine import Engine
    from .state import CounterState

    IntArray = npt.NDArray[np.int64]
    FloatArray = npt.NDArray[np.float64]


def _applies(engine: Engine, isl: IntArray, osl: IntArray, arrivals: FloatArray,
             concurrency: int, chains: list[list[int]] | None) -> bool:
    """Whether the schedule is duration-free and every request would be accepted."""
    cfg = engine.config
    if engine.has_work() or engine.free_blocks != engine.num_blocks or not len(isl):
        return False
    if chains is not None and any(len(chain) != 1 for chain in chains):
        return False
    if bool(arrivals.any()):  # an open loop: sends depend on the clock
        return False
    # Decode never outgrows the token budget (else the engine skips decoders for a step).
    if min(concurrency, cfg.max_num_seqs) * (engine.k + 1) > cfg.max_num_batched_tokens:
        return False
    # add_request would reject one: let the engine say why.
    bs = engine.block_size
    return bool(isl.min() >= 1 and osl.min() >= 1
                and (isl + osl).max() <= cfg.max_model_len
                and -(-(int((isl + osl).max()) + engine.k) // bs) <= engine.num_blocks)


def fits_whole(engine: Engine, isl: IntArray, osl: IntArray, concurrency: int) -> bool:
    """Whether as many of these requests as can run at once fit the KV cache whole (prompt,
    output and drafts): then no admission waits for blocks and nothing is preempted."""
    at_once = min(concurrency, engine.config.max_num_seqs, len(isl))
    longest = int((isl + osl).max()) if len(isl) else 0
    return at_once * -(-(longest + engine.k) // engine.block_size) <= engine.num_blocks


class _Schedule:
    """Which step every request is admitted, prefilled, completes and finishes in, and every
    prefill chunk (its step, its request, the prompt position it computed up to)."""

    def __init__(self, engine: Engine, isl: IntArray, plan: list[int], concurrency: int
                 ) -> None:
        n = len(isl)
        self.first = engine.steps_done
        self.complete = [0] * n  # step whose end emits the first token
        self.plan = plan  # decode steps after it
        self.scheduled = [0] * n  # step that first computed part of the prompt
        self.sent_after = [-1] * n  # step at whose end it was sent (-1: at the start)
        self.chunk_steps: list[int] = []
        self.chunk_req: list[int] = []
        self.chunk_end: list[int] = []
        self.visited: list[int] = []  # steps after which the engine notes its usage
        self.waiting_peak = 0
        self.finish_order: list[int] = []
        self._run(engine, isl, concurrency)

    def _run(self, engine: Engine, isl: IntArray, concurrency: int) -> None:
        cfg = engine.config
        q = engine.k + 1
        budget_max, max_seqs = cfg.max_num_batched_tokens, cfg.max_num_seqs
        isl_l, plan = isl.tolist(), self.plan
        n = len(isl_l)
        # Bound methods and lists in locals: this loop runs once per event of every request.
        complete, scheduled, sent_after = self.complete, self.scheduled, self.sent_after
        chunk_steps, chunk_req, chunk_end = (self.chunk_steps.append, self.chunk_req.append,
                                             self.chunk_end.append)
        visited = self.visited.append
        heappush, heappop = heapq.heappush, heapq.heappop
        sent = min(concurrency, n)  # requests 0 .. sent - 1 are out; an idle engine takes them
        waiting: deque[int] = deque(range(sent))
        running = 0  # requests admitted and not finished
        prefilling: list[int] = []  # admitted, prompt not yet computed whole (admission order)
        prefilled: dict[int, int] = {}
        # (step, request): requests are admitted in their order (FCFS from a queue filled in
        # send order), so a request's index is its admission rank, the engine's tie order.
        finishes: list[tuple[int, int]] = []
        decoding = 0
        transit: list[int] = []
        waiting_peak = 0
        s = self.first
        while waiting or running or transit:
            budget = budget_max - decoding * q
            done_now: list[int] = []
            completed: list[int] = []
            started = 0
            chunked = False
            if prefilling:  # running prefills go on first, in admission order
                still: list[int] = []
                for r in prefilling:
                    if budget <= 0:
                        still.append(r)
                        continue
                    c1 = min(isl_l[r], prefilled[r] + budget)
                    budget -= c1 - prefilled[r]
                    chunk_steps(s)
                    chunk_req(r)
                    chunk_end(c1)
                    chunked = True
                    if c1 < isl_l[r]:
                        prefilled[r] = c1
                        still.append(r)
                        continue
                    del prefilled[r]
                    completed.append(r)
                prefilling = still
            while waiting and running < max_seqs and budget > 0:
                r = waiting.popleft()
                running += 1
                scheduled[r] = s
                c1 = isl_l[r] if isl_l[r] <= budget else budget
                budget -= c1
                chunk_steps(s)
                chunk_req(r)
                chunk_end(c1)
                chunked = True
                if c1 < isl_l[r]:
                    prefilling.append(r)
                    prefilled[r] = c1
                    continue
                completed.append(r)
            if not chunked and not decoding:
                raise _Unplannable  # a stuck prefill: the engine preempts
            for r in completed:  # prompts done: their first token, then their decode steps
                complete[r] = s
                if plan[r]:
                    heappush(finishes, (s + plan[r], r))
                    started += 1
                else:
                    done_now.append(r)
            while finishes and finishes[0][0] == s:
                done_now.append(heappop(finishes)[1])
                decoding -= 1
            if len(done_now) > 1:
                done_now.sort()
            running -= len(done_now)
            decoding += started
            visited(s)
            if len(waiting) > waiting_peak:
                waiting_peak = len(waiting)
            if transit or done_now:
                transit, sent = client_turn(s, waiting, transit, done_now, running, sent,
                                            sent_after, self.finish_order)
            admissible = (waiting and running < max_seqs
                          and budget_max - running * q > 0)
            if transit or prefilling or admissible or not finishes:
                s += 1
            else:  # a stretch of identical decode steps up to the next finish
                s = finishes[0][0]
        self.waiting_peak = waiting_peak
        self.last = s - 1

    def prefill_terms(self, isl: IntArray, steps_n: int, block_size: int, window: float
                      ) -> tuple[FloatArray, IntArray, IntArray, IntArray]:
        """Per step, what its prefill chunks add up to (`planned.prefill_terms`); and per chunk
        its step, its request and the KV blocks its request holds through it."""
        at = np.asarray(self.chunk_steps, np.int64) - self.first
        req = np.asarray(self.chunk_req, np.int64)
        c1 = np.asarray(self.chunk_end, np.int64)
        # A chunk starts where its request's previous chunk ended (chunks of a request come
        # in step order; most requests have one).
        order = np.argsort(req, kind="stable")
        c0 = np.zeros(len(c1), np.int64)
        same = req[order][1:] == req[order][:-1]
        c0[order[1:][same]] = c1[order[:-1][same]]
        terms = prefill_terms(at, c0, c1, c1 == isl[req], steps_n, window)
        return terms, at, req, decode_sums.ceil_div(c1, block_size)


class _Unplannable(Exception):
    """The schedule needs a decision the planner does not make (the engine makes it)."""


def plan_closed_loop(engine: Engine, isl: IntArray, osl: IntArray, arrivals: FloatArray,
                     concurrency: int, chains: list[list[int]] | None
                     ) -> tuple[FloatArray, PlannedFinishes] | None:
    """The load's step durations and its requests in finish order, with the engine advanced
    past it; None (engine untouched) if it does not apply."""
    if not _applies(engine, isl, osl, arrivals, concurrency, chains):
        return None
    if not engine.k and not fits_whole(engine, isl, osl, concurrency):
        return plan_kv_limited(engine, isl, osl, concurrency)  # blocks may run short
    k, q, bs, w = engine.k, engine.k + 1, engine.block_size, engine.window
    sampler, jitter_rng = engine.random_streams()
    plans = _DecodePlans(osl, k, engine.min_emit, sampler)
    try:
        sch = _Schedule(engine, isl, plans.steps.tolist(), concurrency)
    except _Unplannable:
        return None
    s0, steps_n = sch.first, sch.last - sch.first + 1
    complete = np.asarray(sch.complete, np.int64) - s0
    plan = plans.steps
    if k:
        drafted = _Drafted(plans, isl, complete, steps_n, q, bs, w)
        sums = drafted.sums
    else:
        sums = decode_sums.linear(isl, plan, complete + 1, steps_n, q, bs, w)
    # Blocks held during each step: decode steps, plus prefill holdings from each chunk's
    # step to the step before the next chunk (or the first decode step, or after the finish).
    during = sums.held.copy()
    pre, chunk_at, chunk_req, chunk_blocks = sch.prefill_terms(isl, steps_n, bs, w)
    by_request = np.argsort(chunk_req, kind="stable")  # each request's chunks in step order
    grown = chunk_blocks.copy()
    same = chunk_req[by_request][1:] == chunk_req[by_request][:-1]
    grown[by_request[1:][same]] -= chunk_blocks[by_request[:-1][same]]
    last = by_request[np.append(~same, True)]  # each request's last chunk
    prev = np.zeros(len(isl), np.int64)  # blocks through each request's last chunk
    prev[chunk_req[last]] = chunk_blocks[last]
    delta = np.bincount(chunk_at, weights=grown, minlength=steps_n + 2)
    delta -= np.bincount(complete + 1, weights=prev, minlength=steps_n + 2)
    during += np.cumsum(delta)[:steps_n + 1]
    during = during[:steps_n]
    if float(during.max()) > engine.num_blocks:
        return None  # the engine would preempt or hold an admission back
    last_held = prev.copy()
    last_held[plan > 0] = sums.last_held
    freed = np.bincount(complete + plan, weights=last_held, minlength=steps_n)[:steps_n]
    visited = np.asarray(sch.visited, np.int64) - s0
    usage_after = during[visited] - freed[visited]

    # Decoding sequences per step: +1 from each request's first decode step, -1 after its last.
    seqs = np.cumsum(np.bincount(complete + 1, minlength=steps_n + 2)
                     - np.bincount(complete + plan + 1, minlength=steps_n + 2))[:steps_n]
    durations = price_steps(engine, jitter_rng, seqs.astype(np.float64), sums, pre)

    # Commit: the engine is where the step-by-step run would have left it.
    c = commit(engine, isl, osl, sampler, jitter_rng, steps_n)
    if k:
        drafted.count(c)
    c.note_usage(int(usage_after.max()), engine.num_blocks, sch.waiting_peak)

    # With drafts, the tokens per chunk of every request, request after request: 1 for the
    # prefill's token then each decode step's.
    order = sch.finish_order
    return durations, PlannedFinishes(
        index=order, sent_after=[sch.sent_after[r] for r in order],
        first_step=[sch.complete[r] for r in order], chunks=[sch.plan[r] + 1 for r in order],
        scheduled=[sch.scheduled[r] for r in order],
        tokens=drafted.tokens(osl) if k else None)


class _DecodePlans:
    """Every request's speculative decode plan (`state.decode_plan`), drawn in one go.

    The engine draws a plan when a prefill completes, and prefills complete in admission
    order, which in a closed loop is the requests' order: so the draws are the stream's next
    `sum(draws)` values, request after request. `steps` decode steps per request; with
    `accepted` (the draws) and their running sum, the tokens out before each step.
    """

    def __init__(self, osl: IntArray, k: int, min_emit: int, sampler: AcceptanceSampler
                 ) -> None:
        remaining = osl - 1
        if not k:
            self.steps: IntArray = remaining
            return
        draws = plan_draws(remaining, min_emit)  # as Engine._start_decoding
        self.offsets: IntArray = np.cumsum(draws) - draws
        self.accepted = sampler.draw(int(draws.sum()))  # one byte a count
        # Tokens out before each draw, over all requests (and after the last): strictly
        # increasing, so one search finds where each request's plan reaches its tokens.
        self.before: IntArray = np.zeros(len(self.accepted) + 1, np.int64)
        np.cumsum(self.accepted + 1, out=self.before[1:])
        self.base: IntArray = self.before[self.offsets]  # out before each request's first
        reach = np.searchsorted(self.before[1:], self.base + remaining, side="left")
        self.steps = np.where(remaining > 0, reach - self.offsets + 1, 0)


class _Drafted:
    """The per-step sums with speculative decoding, over every (request, decode step)
    element: each step moves a context by its drawn accepted drafts plus one."""

    def __init__(self, plans: _DecodePlans, isl: IntArray, complete: IntArray, steps_n: int,
                 q: int, bs: int, w: float) -> None:
        plan = self.plan = plans.steps
        self.starts = np.cumsum(plan) - plan  # each request's first element
        n_el = int(plan.sum())
        # Element j of request r is its draw offsets[r] + j, in step complete[r] + 1 + j: a
        # per-request shift plus the element's own index.
        self.pos = pos = np.repeat(plans.offsets - self.starts, plan)
        pos += np.arange(n_el, dtype=np.int64)
        at = np.repeat(complete + 1 - plans.offsets, plan)
        at += pos
        # Its context: the prompt plus the tokens out before its draw within its request.
        self.ctx = ctx = plans.before[pos]
        ctx += np.repeat(isl - plans.base, plan)
        self.lasts = (self.starts + plan - 1)[plan > 0]
        self.isl = isl
        ctx_sum = np.bincount(at, weights=ctx, minlength=steps_n + 1)
        win_sum = (np.bincount(at, weights=np.minimum(ctx, w), minlength=steps_n)[:steps_n]
                   if math.isfinite(w) else ctx_sum[:steps_n])
        # Blocks held: its context and the q tokens it writes (with pages of one token, the
        # contexts' sum plus q per sequence, without another pass over the elements).
        if bs == 1:
            held = np.asarray(np.bincount(at, minlength=steps_n + 1) * float(q) + ctx_sum,
                              np.float64)
            last_held = ctx[self.lasts] + q
        else:
            blocks = decode_sums.ceil_div(ctx + q, bs)
            held = np.bincount(at, weights=blocks, minlength=steps_n + 1).astype(np.float64)
            last_held = blocks[self.lasts]
        self.sums = decode_sums.DecodeSums(held.astype(np.float64),
                                           ctx_sum[:steps_n].astype(np.float64),
                                           win_sum.astype(np.float64), last_held)
        self.accepted = plans.accepted[pos]  # accepted drafts per step

    def count(self, c: CounterState) -> None:
        """The engine's draft counters for these steps."""
        c.drafts += len(self.accepted)
        c.accepted += int(self.accepted.sum())
        c.histogram += np.bincount(self.accepted, minlength=c.k + 1)

    def tokens(self, osl: IntArray) -> IntArray:
        """Per request, 1 for the prefill's token then what each decode step emits: its
        accepted drafts and one token; the last emits what is still owed."""
        plan, isl = self.plan, self.isl
        emitted = self.accepted.astype(np.int64) + 1
        if len(emitted):
            # owed: osl - 1 - (ctx - isl)
            emitted[self.lasts] = (osl - 1 + isl)[plan > 0] - self.ctx[self.lasts]
        tokens: IntArray = np.insert(emitted, self.starts, 1)  # each request's prefill token
        return tokens
