"""A closed loop's schedule where the KV cache runs short: admissions held back, prefill chunks
waiting for their blocks, and decoders preempted, as `Engine.step` does them, without drafts.

Without speculative decoding a decoding sequence's context grows by one token a step, so the
steps at which it needs a new KV block recur every `block_size` steps at a phase of its own:
the blocks all decoders need in a step is one count per phase, and a stretch of decode steps
to the next finish is cut, as `stretch.plan` cuts it, at the first step whose needs no longer
fit. Everything else is `closed_loop._Schedule`'s event loop (a finish sends the next request,
which is in transit for one step), plus the engine's rules where blocks run short:

- decode first: when the decoders' needs exceed the free blocks, the running requests behind
  the longest prefix (in admission order) whose decoders' needs fit the free blocks plus the
  blocks of everything behind it are preempted, newest first, each to the front of the queue;
  a preempted request keeps its tokens and recomputes its prompt and them when readmitted,
  where its first step samples one more token;
- a prefill chunk takes what the budget allows, its blocks whole or not at all (it waits);
- an admission waits while its first chunk's blocks are not free;
- a step with nothing to decode or prefill (every running prefill stuck without blocks) is
  left to the engine: `plan_kv_limited` returns None.

`tests/sim/test_closed_loop.py` holds it to the engine run step by step.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from . import decode_sums
from .planned import PlannedFinishes, client_turn, commit, prefill_terms, price_steps

if TYPE_CHECKING:
    import numpy.typing as npt

    from .engine import Engine

    IntArray = npt.NDArray[np.int64]
    FloatArray = npt.NDArray[np.float64]


class KVSchedule:
    """Which steps every request's runs of tokens take (one more after each preemption), every
    prefill chunk (step, from, to, completes the prompt) and the peaks the engine would note.
    Raises `StuckPrefills` where every running request is a prefill stuck without blocks."""

    def __init__(self, engine: Engine, isl: IntArray, osl: IntArray, concurrency: int) -> None:
        if engine.k:
            raise ValueError("the KV-limited schedule plans plain decoding only")
        n = len(isl)
        self.first = engine.steps_done
        self.scheduled = [-1] * n  # the step that first computed part of its prompt
        self.sent_after = [-1] * n  # the step at whose end it was sent (-1: at the start)
        # Per request, its runs: [the step that emitted its first token, decode steps after].
        self.runs: list[list[list[int]]] = [[] for _ in range(n)]
        self.chunk_steps: list[int] = []
        self.chunk_from: list[int] = []
        self.chunk_to: list[int] = []
        self.chunk_completes: list[bool] = []
        self.finish_order: list[int] = []
        self.preemptions = 0
        self.peak_used = 0
        self.waiting_peak = 0
        self._run(engine, isl.tolist(), osl.tolist(), concurrency)

    def _run(self, engine: Engine, isl: list[int], osl: list[int], concurrency: int) -> None:
        cfg = engine.config
        bs, total = engine.block_size, engine.num_blocks
        budget_max, max_seqs = cfg.max_num_batched_tokens, cfg.max_num_seqs
        n = len(isl)
        runs, scheduled, sent_after = self.runs, self.scheduled, self.sent_after
        chunk_steps, chunk_from, chunk_to, chunk_completes = (
            self.chunk_steps.append, self.chunk_from.append, self.chunk_to.append,
            self.chunk_completes.append)
        free = total
        generated = [0] * n  # tokens out so far (a preemption keeps them)
        target = [0] * n  # prompt and tokens out at its admission: what its prefill computes
        admitted_as = [0] * n  # admission number: the engine's order among running requests
        admissions = 0
        running: list[int] = []  # in admission order
        prefilled: dict[int, int] = {}  # running requests still prefilling: tokens computed
        first_decode: dict[int, int] = {}  # decoding requests: their first decode step
        phase_of: dict[int, int] = {}
        # Decoders by phase: a decoder whose context is c at step u needs a block iff
        # c % bs == 0, i.e. at the steps u with (u + phase) % bs == 0.
        phase_count = [0] * bs
        # The same facts as columns by request, for the preemption pass over up to
        # max_num_seqs running requests: tokens prefilled (-1: not prefilling), phase (-1: not
        # decoding), first decode step and admission target.
        pf_col = np.full(n, -1, dtype=np.int64)
        ph_col = np.full(n, -1, dtype=np.int64)
        fd_col = np.zeros(n, dtype=np.int64)
        tg_col = np.zeros(n, dtype=np.int64)
        finishes: list[tuple[int, int, int]] = []  # (step, admission number, request)
        sent = min(concurrency, n)  # an idle engine takes the first ones at once
        waiting: deque[int] = deque(range(sent))
        transit: list[int] = []
        s = self.first

        def held(r: int, u: int) -> int:
            """Blocks request r holds before step u's decode allocation."""
            if r in prefilled:
                return -(-prefilled[r] // bs)
            return -(-(target[r] + u - first_decode[r]) // bs)

        def preempt(r: int, u: int) -> int:
            """Back to the front of the queue before step u; the blocks it frees."""
            freed = held(r, u)
            if r in prefilled:
                del prefilled[r]
                pf_col[r] = -1
            else:
                a = first_decode.pop(r)
                phase_count[phase_of.pop(r)] -= 1
                ph_col[r] = -1
                runs[r][-1][1] = u - a
                generated[r] += u - a
            running.remove(r)
            waiting.appendleft(r)
            self.preemptions += 1
            return freed

        def crossings(u: int) -> int:
            return phase_count[-u % bs]

        while waiting or running or transit:
            # Decode first, in admission order; preempt from the back when blocks run short.
            decoders = len(first_decode)
            need = crossings(s) if decoders else 0
            if need > free:
                # Keep running[:keep], the longest prefix whose decoders' needs fit the free
                # blocks plus the blocks held behind it: at i the prefix's need is needs[:i+1]
                # summed, the blocks behind are holds[i+1:].
                at = np.array(running, dtype=np.int64)
                ph = ph_col[at]
                decoding = ph >= 0
                needs = (decoding & ((s + ph) % bs == 0)).cumsum()
                holds = np.where(decoding, -(-(tg_col[at] + s - fd_col[at]) // bs),
                                 -(-pf_col[at] // bs)).cumsum()
                short = np.flatnonzero(needs > free + int(holds[-1]) - holds)
                keep = int(short[0]) if len(short) else len(running)
                fit = int(needs[keep - 1]) if keep else 0
                for r in running[keep:][::-1]:  # newest first
                    free += preempt(r, s)
                free -= fit
                decoders = len(first_decode)
            else:
                free -= need
            budget = budget_max - decoders
            completed: list[int] = []
            chunked = False
            # `prefilled` gains a request when `running` does and keeps its place while it
            # chunks, so its keys are the running prefills in admission order.
            for r in list(prefilled):
                if budget <= 0:
                    break
                done = prefilled[r]
                blocks = -(-done // bs)
                c = min(target[r] - done, budget)
                if c <= 0 or (blocks + free) * bs < done + c:
                    continue  # its chunk's blocks whole or not at all: it waits
                free -= -(-(done + c) // bs) - blocks
                budget -= c
                chunk_steps(s)
                chunk_from(done)
                chunk_to(done + c)
                chunk_completes(done + c == target[r])
                chunked = True
                if done + c == target[r]:
                    del prefilled[r]
                    pf_col[r] = -1
                    completed.append(r)
                else:
                    prefilled[r] = pf_col[r] = done + c
            while waiting and len(running) < max_seqs and budget > 0:
                r = waiting[0]
                t = isl[r] + generated[r]
                c = min(t, budget)
                if -(-c // bs) > free:
                    break  # its first chunk's blocks are not free
                waiting.popleft()
                running.append(r)
                admitted_as[r] = admissions
                admissions += 1
                if scheduled[r] < 0:
                    scheduled[r] = s
                target[r] = tg_col[r] = t
                free -= -(-c // bs)
                budget -= c
                chunk_steps(s)
                chunk_from(0)
                chunk_to(c)
                chunk_completes(c == t)
                chunked = True
                if c == t:
                    completed.append(r)
                else:
                    prefilled[r] = pf_col[r] = c
            if not decoders and not chunked and running:
                # Every running request is a prefill stuck without blocks (the engine
                # preempts the newest in a step that does nothing else): left to the engine.
                raise StuckPrefills
            done_now: list[int] = []
            for r in completed:  # the prompt's step samples one token; then its decode plan
                generated[r] += 1
                runs[r].append([s, 0])
                plan = osl[r] - generated[r]
                if plan:
                    first_decode[r] = fd_col[r] = s + 1
                    phase_of[r] = ph_col[r] = (target[r] - s - 1) % bs
                    phase_count[phase_of[r]] += 1
                    heapq.heappush(finishes, (s + plan, admitted_as[r], r))
                else:
                    done_now.append(r)
            while finishes and finishes[0][0] == s:
                _, number, r = heapq.heappop(finishes)
                if r in first_decode and admitted_as[r] == number:  # not preempted since
                    done_now.append(r)
            if len(done_now) > 1:
                done_now.sort(key=admitted_as.__getitem__)  # the engine's order: admission
            for r in done_now:
                if r in first_decode:
                    steps = s + 1 - first_decode.pop(r)
                    phase_count[phase_of.pop(r)] -= 1
                    ph_col[r] = -1
                    runs[r][-1][1] = steps
                    generated[r] += steps
                    free += -(-(target[r] + steps) // bs)
                else:
                    free += -(-target[r] // bs)
                running.remove(r)
            # The engine notes its usage after the step (or the stretch) it ran.
            self.peak_used = max(self.peak_used, total - free)
            self.waiting_peak = max(self.waiting_peak, len(waiting))
            if transit or done_now:
                transit, sent = client_turn(s, waiting, transit, done_now, len(running), sent,
                                            sent_after, self.finish_order)
            while finishes and not (finishes[0][2] in first_decode
                                    and admitted_as[finishes[0][2]] == finishes[0][1]):
                heapq.heappop(finishes)  # a preempted decoder's old finish
            jump = 0
            if not transit and not prefilled and finishes and not self._admits(
                    waiting, running, isl, generated, free, crossings(s + 1), bs,
                    budget_max, max_seqs):
                # A stretch of decode steps to the next finish, cut where the blocks the
                # decoders need run out (the engine runs that step on its own).
                jump = min(finishes[0][0] - s, _steps_that_fit(phase_count, s, free, bs))
            if jump > 1:  # the steps before the stretch's last take their blocks here
                free -= _needed(phase_count, s, jump - 1, bs)
            s += max(jump, 1)
        self.last = s - 1

    @staticmethod
    def _admits(waiting: deque[int], running: list[int], isl: list[int], generated: list[int],
                free: int, growth: int, bs: int, budget_max: int, max_seqs: int) -> bool:
        """`Engine.can_admit` with every running request decoding: would the next step admit
        (part of) the first waiting request, after its decoders took their blocks?"""
        if not waiting or len(running) >= max_seqs:
            return False
        budget = budget_max - len(running)
        if budget <= 0:
            return False
        r = waiting[0]
        return -(-min(isl[r] + generated[r], budget) // bs) + growth <= free


def _needed(phase_count: list[int], s: int, k: int, bs: int) -> int:
    """Blocks the decoders need over steps s + 1 .. s + k."""
    if k <= 0:
        return 0
    decoders = sum(phase_count)
    periods, rest = divmod(k, bs)
    return periods * decoders + sum(phase_count[-u % bs] for u in range(s + 1, s + 1 + rest))


def _steps_that_fit(phase_count: list[int], s: int, free: int, bs: int) -> int:
    """How many decode steps after s have their blocks within `free` (`stretch.plan`'s cut)."""
    decoders = sum(phase_count)
    if not decoders:
        return 1 << 62
    periods = free // decoders  # whole periods of bs steps each take `decoders` blocks
    left = free - periods * decoders
    steps = periods * bs
    for u in range(s + 1 + steps, s + 1 + steps + bs):
        left -= phase_count[-u % bs]
        if left < 0:
            break
        steps += 1
    return steps


class StuckPrefills(Exception):
    """Every running request is a prefill stuck without blocks: the engine preempts the
    newest in a step that does nothing else, which this schedule leaves to it."""


def plan_kv_limited(engine: Engine, isl: IntArray, osl: IntArray, concurrency: int
                    ) -> tuple[FloatArray, PlannedFinishes] | None:
    """The load's step durations and its requests in finish order, with the engine advanced
    past it (as `closed_loop.plan_closed_loop`, which checks that the load is a closed loop
    this plans); None (engine untouched) where prefills get stuck."""
    bs, w = engine.block_size, engine.window
    sampler, jitter_rng = engine.random_streams()
    try:
        sch = KVSchedule(engine, isl, osl, concurrency)
    except StuckPrefills:
        return None
    s0, steps_n = sch.first, sch.last - sch.first + 1
    # Decode runs: from the step after the one that emitted a run's first token, with the
    # context its prefill computed (its prompt and the tokens out before) growing one a step.
    runs = [(r, start, steps) for r, request_runs in enumerate(sch.runs)
            for start, steps in request_runs]
    run_req = np.asarray([r for r, _, _ in runs], np.int64)
    run_start = np.asarray([start for _, start, _ in runs], np.int64) - s0
    run_steps = np.asarray([steps for _, _, steps in runs], np.int64)
    run_ctx = isl[run_req] + _tokens_before(run_req, run_steps)
    sums = decode_sums.linear(run_ctx, run_steps, run_start + 1, steps_n, 1, bs, w)
    seqs = np.cumsum(np.bincount(run_start + 1, minlength=steps_n + 2)
                     - np.bincount(run_start + run_steps + 1, minlength=steps_n + 2))[:steps_n]
    pre = prefill_terms(np.asarray(sch.chunk_steps, np.int64) - s0,
                        np.asarray(sch.chunk_from, np.int64), np.asarray(sch.chunk_to, np.int64),
                        np.asarray(sch.chunk_completes, bool), steps_n, w)
    durations = price_steps(engine, jitter_rng, seqs.astype(np.float64), sums, pre)

    # Commit: the engine is where the step-by-step run would have left it.
    c = commit(engine, isl, osl, sampler, jitter_rng, steps_n)
    c.preemptions += sch.preemptions
    c.note_usage(sch.peak_used, engine.num_blocks, sch.waiting_peak)

    order = sch.finish_order
    broken: dict[int, IntArray] = {}
    first_step, chunks = [], []
    for pos, r in enumerate(order):
        request_runs = sch.runs[r]
        if len(request_runs) == 1:
            start, steps = request_runs[0]
            first_step.append(start)
            chunks.append(steps + 1)
        else:  # preempted: its runs' steps, each its first token's step and its decode steps
            broken[pos] = np.concatenate([np.arange(start, start + steps + 1, dtype=np.int64)
                                          for start, steps in request_runs])
            first_step.append(-1)
            chunks.append(len(broken[pos]))
    return durations, PlannedFinishes(
        index=order, sent_after=[sch.sent_after[r] for r in order], first_step=first_step,
        chunks=chunks, scheduled=[sch.scheduled[r] for r in order], tokens=None,
        broken=broken)


def _tokens_before(run_req: IntArray, run_steps: IntArray) -> IntArray:
    """Per run, the tokens its request put out in its earlier runs (the runs come request by
    request, in order): each run emits one token, then one per decode step."""
    out = np.cumsum(run_steps + 1) - (run_steps + 1)  # over all runs before
    first = np.ones(len(run_req), bool)
    first[1:] = run_req[1:] != run_req[:-1]
    start = np.maximum.accumulate(np.where(first, np.arange(len(run_req)), 0))
    before: IntArray = out - out[start]
    return before
