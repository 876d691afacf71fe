"""A decode instance of a disaggregated deployment, run from per-step sums. No clock, no I/O.

Every request reaches a decode instance with its prompt's KV cache computed elsewhere: its
admission step takes the prompt's blocks and samples the first token (`Engine.add_request(
kv_ready=True)`), and from the next step on it decodes its plan. Unless it is preempted, which
steps it decodes in, the context each of them reads, the KV blocks each adds, the tokens each
emits and the drafts each accepts are all known the moment it is admitted. So they are added
then into arrays indexed by step, and a step is priced from its sums (decoders, context, blocks
added) rather than from a row per request: a busy instance admits a request at almost every
step, and an engine step over thousands of rows was most of a multinode point's time.

It follows `Engine.step`, `stretch.plan` / `commit` and `Instance` rule for rule, with the same
float operations, so a deployment's token times and counters are those of an engine-backed
instance (`tests/sim/test_lean_instances.py`). Where the engine would preempt a request or
leave decoders over the token budget waiting, it raises `Declined`, and the point runs on
engines.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .engine import RequestRejectedError
from .instance import MAX_STRETCH, Declined, LeanInstance
from .physics import PrefillTerms
from .state import decode_plan, plan_draws

if TYPE_CHECKING:
    import numpy.typing as npt

    from .engine import Engine

    IntArray = npt.NDArray[np.int64]


class _Stretch(NamedTuple):
    """Steps `first`.. of identical decoders, priced but not yet applied."""

    first: int
    decoders: int
    durations: npt.NDArray[np.float64]

    @property
    def n(self) -> int:
        return len(self.durations)


class _Admitted(NamedTuple):
    step: int  # its admission step; it decodes in the steps after it, through `last`
    last: int
    blocks: int  # KV blocks it holds at its end
    tokens: IntArray | None  # tokens per step from its admission (None: one each)
    accepted: IntArray | None  # drafts accepted at each decode step


class DecodeInstance(LeanInstance):
    role = "decode"

    def __init__(self, index: int, engine: Engine) -> None:
        super().__init__(index, engine)
        self._pending: tuple[_Stretch, float, npt.NDArray[np.float64]] | None = None
        cfg = engine.config
        self.q = engine.k + 1
        self.budget = cfg.max_num_batched_tokens
        self.window = engine.window
        self.ctx_cap = float(cfg.max_model_len + engine.k + 1)
        self.waiting: deque[tuple[int, int, int]] = deque()
        self.running = 0
        # Per step index: decoders, their context, its sum under the window, the blocks they
        # add before the step, the tokens they emit and the drafts they accept.
        self._decoders, self._ctx, self._win, self._grow, self._tokens, self._accepted = (
            np.zeros(1024, np.int64) for _ in range(6))
        self._ends: dict[int, list[int]] = {}  # step -> requests ending then, in admission order
        self._end_steps: list[int] = []  # heap of the keys of _ends
        self._admitted: dict[int, _Admitted] = {}
        self._ramp_cache = np.arange(1024, dtype=np.int64)
        self._ones = np.ones(0, dtype=np.int64)

    # ----------------------------------------------------------------- requests
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def token_steps(self, request_id: int) -> tuple[slice, IntArray, int]:
        """As `Instance.token_steps`: its admission step through its last one."""
        req = self._admitted.pop(request_id)
        n = req.last - req.step + 1
        if req.tokens is not None:
            return slice(req.step, req.last + 1), req.tokens, req.step
        if n > len(self._ones):  # one token a step: a view of one array of ones, read only
            self._ones = np.ones(max(n, 2 * len(self._ones)), dtype=np.int64)
            self._ones.flags.writeable = False
        return slice(req.step, req.last + 1), self._ones[:n], req.step

    def add(self, rid: int, prompt: int, max_tokens: int, now: float,
            kv_ready: bool = False) -> None:
        """As `Instance.add`: through the step running now; after the next one if a step ends
        exactly now."""
        if not kv_ready:
            raise Declined("a decode instance is sent a prompt to compute")
        self.settle(now)
        if self.busy_until is None and self.ended_busy:
            self.deferred.append((rid, prompt, max_tokens, kv_ready))
        else:
            self._enqueue(rid, prompt, max_tokens)

    def _enqueue(self, rid: int, prompt: int, max_tokens: int) -> None:
        if prompt < 1 or max_tokens < 1:
            raise RequestRejectedError("prompt_tokens and max_tokens must be at least 1")
        self.waiting.append((rid, prompt, max_tokens))

    # ----------------------------------------------------------------- running
    def start(self, now: float, stretch: bool) -> None:
        """As `Instance.start` with stretches."""
        if not stretch:
            raise Declined("stepped one step at a time")
        self.ended_busy = False
        planned = self._plan(1 if self.deferred else MAX_STRETCH)
        if planned is not None and not self.deferred:
            self._pending = (planned, now, now + planned.durations.cumsum())
            self.busy_until = float(self._pending[2][-1])
            self.finished = []
            return
        if planned is not None:
            durations, finished = self._commit(planned, planned.n)
        else:
            duration, finished = self._step()
            durations = np.array([duration])
        self.busy_until = self.timeline.add(now, durations)
        self.finished = finished
        for rid, prompt, max_tokens, _ in self.deferred:
            self._enqueue(rid, prompt, max_tokens)
        self.deferred.clear()

    def settle(self, now: float) -> None:
        """As `Instance.settle`: apply the pending stretch through the step running now."""
        if self._pending is None:
            return
        stretch, start, ends = self._pending
        n = min(int(ends.searchsorted(now, "right")) + 1, stretch.n)
        if n == stretch.n and n >= 2:  # its peak is after its next-to-last step
            grown = int(self._grow[stretch.first:stretch.first + n - 1].sum())
            self._note_usage(grown)
        durations, self.finished = self._commit(stretch, n)
        self.busy_until = self.timeline.add(start, durations)
        self._pending = None

    def _can_admit(self, step: int) -> bool:
        """`Engine.can_admit`: every running request decodes, and adds `_grow[step]` blocks."""
        if not self.waiting or self.running >= self.engine.config.max_num_seqs:
            return False
        if self.budget - self.running * self.q <= 0:
            return False
        return (self._blocks_for(self.waiting[0][1]) + int(self._grow[step])
                <= self.engine.free_blocks)

    def _plan(self, max_steps: int) -> _Stretch | None:
        """`stretch.plan`: the stretch of identical decode steps it is in, or None."""
        if not self.running or max_steps < 1:
            return None
        t = self.engine.steps_done
        self._reserve(t + 1)
        decoders = int(self._decoders[t])
        if decoders * self.q > self.budget:
            raise Declined("more decoders than the token budget holds")
        if self._can_admit(t):
            return None
        n = min(self._end_steps[0] - t + 1, max_steps)
        free = self.engine.free_blocks
        if decoders * (-(-(n * self.q) // self.engine.block_size) + 1) > free:
            over = np.nonzero(self._grow[t:t + n].cumsum() > free)[0]
            if len(over):
                n = int(over[0])
                if n < 1:
                    return None
        ctx = self._ctx[t:t + n].astype(np.float64)
        win = self._win[t:t + n].astype(np.float64) if math.isfinite(self.window) else ctx
        durations = self.engine.cost.stretch(float(decoders), ctx, win)
        return _Stretch(t, decoders, durations)

    def _commit(self, stretch: _Stretch, n: int) -> tuple[npt.NDArray[np.float64], list[int]]:
        """`stretch.commit`: apply its first n steps."""
        engine, t = self.engine, stretch.first
        engine.free_blocks -= int(self._grow[t:t + n].sum())
        c = engine.counters_state
        if engine.k:
            c.drafts += stretch.decoders * n
            c.accepted += int(self._accepted[t:t + n].sum())
            c.generation_tokens += int(self._tokens[t:t + n].sum())
        else:
            c.generation_tokens += n * stretch.decoders
        engine.steps_done += n
        finished = self._finish(t + n - 1) if n == stretch.n else []
        self._note_usage()
        return stretch.durations[:n], finished

    def _step(self) -> tuple[float, list[int]]:
        """`Engine.step`: decode, then admit arrived requests FCFS; one step's price."""
        engine = self.engine
        t = engine.steps_done
        self._reserve(t + 1)
        decoders = int(self._decoders[t])
        if decoders * self.q > self.budget:
            raise Declined("more decoders than the token budget holds")
        grow = int(self._grow[t])
        if grow > engine.free_blocks:
            raise Declined("the decoders' blocks run short: the engine preempts")
        engine.free_blocks -= grow
        budget = self.budget - decoders * self.q
        terms = PrefillTerms(self.window)
        admitted: list[tuple[int, int, int, int]] = []
        while (self.waiting and self.running < engine.config.max_num_seqs and budget > 0):
            rid, prompt, max_tokens = self.waiting[0]
            blocks = self._blocks_for(prompt)
            if blocks > engine.free_blocks:
                break
            self.waiting.popleft()
            engine.free_blocks -= blocks
            self.running += 1
            budget -= 1
            terms.add(float(prompt), 0, True)
            admitted.append((rid, prompt, max_tokens, blocks))
        if not decoders and not admitted and self.running:
            raise Declined("no step to run")
        ctx = float(self._ctx[t])
        duration = engine.cost.step_with(
            float(decoders), ctx, float(self._win[t]) if self.window < self.ctx_cap else ctx,
            terms)
        c = engine.counters_state
        if engine.k:
            c.drafts += decoders
            c.accepted += int(self._accepted[t])
            c.generation_tokens += int(self._tokens[t])
        else:
            c.generation_tokens += decoders
        for rid, prompt, max_tokens, blocks in admitted:
            c.prompt_tokens += prompt
            c.generation_tokens += 1
            self._admit(rid, prompt, max_tokens, t, blocks)
        engine.steps_done += 1
        finished = self._finish(t)
        self._note_usage()
        return duration, finished

    def _admit(self, rid: int, prompt: int, max_tokens: int, step: int, blocks: int) -> None:
        """Its first token comes with this step; its plan's decode steps follow it: add what
        each of them decodes, reads, holds, emits and accepts into the per-step sums."""
        engine = self.engine
        remaining = max_tokens - 1
        tokens = accepted = None
        before = np.zeros(0, dtype=np.int64)
        if engine.k:
            drawn = engine.draw_accepted(plan_draws(remaining, engine.min_emit))
            steps, before, accepted = decode_plan(remaining, drawn)
            emitted = np.empty(steps + 1, dtype=np.int64)
            emitted[0] = 1
            if steps:
                emitted[1:-1] = before[1:] - before[:-1]
                emitted[-1] = remaining - before[-1]
            tokens = emitted
        else:
            steps = remaining
        last = step + steps
        held = blocks
        if steps:
            self._reserve(last + 1)
            span = slice(step + 1, last + 1)
            self._decoders[span] += 1
            bs = engine.block_size
            if tokens is None:  # one token a step: its context is a ramp from the prompt
                ramp = self._ramp(steps)
                sums = self._ctx[span]
                sums += prompt
                sums += ramp
                if math.isfinite(self.window):
                    self._win[span] += np.minimum(prompt + ramp, int(self.window))
                # The step reading prompt + i writes its token into a new block where
                # prompt + i is a multiple of the block size.
                self._grow[step + 1 + (-prompt) % bs:last + 1:bs] += 1
                held = -(-(prompt + steps) // bs)
            else:
                ctx = prompt + before
                self._ctx[span] += ctx
                if math.isfinite(self.window):
                    self._win[span] += np.minimum(ctx, int(self.window))
                need = -(-(ctx + self.q) // bs)
                grow = self._grow[span]  # each step adds what it holds over the step before
                grow += need
                grow[1:] -= need[:-1]
                grow[0] -= blocks
                held = int(need[-1])
                self._tokens[span] += tokens[1:]
                if accepted is not None:
                    self._accepted[span] += accepted
        ending = self._ends.get(last)
        if ending is None:
            self._ends[last] = [rid]
            heapq.heappush(self._end_steps, last)
        else:
            ending.append(rid)
        self._admitted[rid] = _Admitted(step, last, held, tokens, accepted)

    def _finish(self, step: int) -> list[int]:
        """The requests whose last step is `step` end, in admission order."""
        ending = self._ends.pop(step, None)
        if ending is None:
            return []
        heapq.heappop(self._end_steps)
        engine = self.engine
        c = engine.counters_state
        for rid in ending:
            req = self._admitted[rid]
            engine.free_blocks += req.blocks
            if req.accepted is not None and len(req.accepted):
                c.histogram += np.bincount(req.accepted, minlength=engine.k + 1)
        self.running -= len(ending)
        c.requests_finished += len(ending)
        return ending

    def _note_usage(self, grown: int = 0) -> None:
        engine = self.engine
        engine.counters_state.note_usage(engine.num_blocks - engine.free_blocks + grown,
                                         engine.num_blocks, len(self.waiting))

    def _ramp(self, n: int) -> IntArray:
        """0, 1, ..., n - 1 (a view of one array kept for every request)."""
        if n > len(self._ramp_cache):
            self._ramp_cache = np.arange(max(n, 2 * len(self._ramp_cache)), dtype=np.int64)
        return self._ramp_cache[:n]

    def _reserve(self, index: int) -> None:
        """Room in the per-step sums through step `index`."""
        size = len(self._decoders)
        if index < size:
            return
        grow = max(size, index + 1 - size)
        self._decoders, self._ctx, self._win, self._grow, self._tokens, self._accepted = (
            np.concatenate([a, np.zeros(grow, np.int64)]) for a in (
                self._decoders, self._ctx, self._win, self._grow, self._tokens,
                self._accepted))
