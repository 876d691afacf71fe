"""A prefill instance of a disaggregated deployment without an engine's slot table. No clock,
no I/O.

A prefill instance only computes prompts: each request ends in the step that completes its
prompt, with its first token (a request of one output token). Its steps follow `Engine.step`
for such requests rule for rule, with the same float operations: running prompts' chunks in
admission order, then FCFS admissions while the token budget, `max_num_seqs` and the blocks of
the first chunk allow, a chunk waiting until its blocks are free, the step priced from its
chunks; blocks freed as prompts complete. Its requests are few and short-lived, so it keeps
them in a list rather than numpy rows. Where the engine would preempt (every running prompt
stuck without blocks) it raises `Declined`. `tests/sim/test_lean_instances.py` holds
deployments of it to engine-backed ones.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from .engine import RequestRejectedError
from .instance import Declined, LeanInstance
from .physics import PrefillTerms

if TYPE_CHECKING:
    import numpy.typing as npt

    from .engine import Engine

_ONE_TOKEN = np.ones(1, dtype=np.int64)
_ONE_TOKEN.flags.writeable = False


class _Prompt:
    __slots__ = ("blocks", "done", "prompt", "rid")

    def __init__(self, rid: int, prompt: int) -> None:
        self.rid, self.prompt = rid, prompt
        self.done = 0  # prompt tokens computed
        self.blocks = 0


class PrefillInstance(LeanInstance):
    role = "prefill"

    def __init__(self, index: int, engine: Engine) -> None:
        super().__init__(index, engine)
        self.waiting: deque[tuple[int, int]] = deque()
        self.running: list[_Prompt] = []
        self._first_steps: dict[int, int] = {}  # request -> step that began its prompt

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def token_steps(self, request_id: int) -> tuple[slice, npt.NDArray[np.int64], int]:
        """As `Instance.token_steps`: the step that completed its prompt."""
        step = self.engine.steps_done - 1
        return slice(step, step + 1), _ONE_TOKEN, self._first_steps.pop(request_id)

    def settle(self, now: float) -> None:
        """Nothing to settle: it never runs a stretch (its requests never decode)."""

    def add(self, rid: int, prompt: int, max_tokens: int, now: float,
            kv_ready: bool = False) -> None:
        """As `Instance.add`: after the next step if a step ends exactly now."""
        if max_tokens != 1 or kv_ready:
            raise Declined("a prefill instance is sent a request to decode")
        if self.busy_until is None and self.ended_busy:
            self.deferred.append((rid, prompt, max_tokens, kv_ready))
        else:
            self._enqueue(rid, prompt)

    def _enqueue(self, rid: int, prompt: int) -> None:
        # The cluster checked its length against the worker's context and cache when routing.
        if prompt < 1:
            raise RequestRejectedError("prompt_tokens and max_tokens must be at least 1")
        self.waiting.append((rid, prompt))

    def start(self, now: float, stretch: bool) -> None:
        """As `Instance.start`: a prefill instance runs one step at a time."""
        self.ended_busy = False
        duration, self.finished = self._step()
        self.busy_until = self.timeline.add(now, np.array([duration]))
        for rid, prompt, _, _ in self.deferred:
            self._enqueue(rid, prompt)
        self.deferred.clear()

    def _chunk(self, req: _Prompt, budget: int, terms: PrefillTerms,
               chunks: list[tuple[_Prompt, int]]) -> int:
        """`Engine._schedule_prefill`: as much of its prompt as the budget allows, its blocks
        whole or not at all."""
        engine = self.engine
        bs = engine.block_size
        chunk = min(req.prompt - req.done, budget)
        if chunk <= 0 or (req.blocks + engine.free_blocks) * bs < req.done + chunk:
            return 0
        need = -(-(req.done + chunk) // bs) - req.blocks
        engine.free_blocks -= need
        req.blocks += need
        terms.add(float(req.done), chunk, req.done + chunk == req.prompt)
        chunks.append((req, chunk))
        return chunk

    def _step(self) -> tuple[float, list[int]]:
        engine = self.engine
        budget = engine.config.max_num_batched_tokens
        terms = PrefillTerms(engine.window)
        chunks: list[tuple[_Prompt, int]] = []
        for req in self.running:
            if budget <= 0:
                break
            budget -= self._chunk(req, budget, terms, chunks)
        while self.waiting and len(self.running) < engine.config.max_num_seqs and budget > 0:
            rid, prompt = self.waiting[0]
            if self._blocks_for(min(prompt, budget)) > engine.free_blocks:
                break
            self.waiting.popleft()
            req = _Prompt(rid, prompt)
            self._first_steps[rid] = engine.steps_done
            self.running.append(req)
            budget -= self._chunk(req, budget, terms, chunks)
        if not chunks and self.running:
            raise Declined("every running prompt is stuck without blocks: the engine preempts")
        duration = engine.cost.step_with(0.0, 0.0, 0.0, terms)  # no decoders
        c = engine.counters_state
        finished: list[int] = []
        for req, n in chunks:
            req.done += n
            if req.done == req.prompt:
                c.prompt_tokens += req.prompt
                c.generation_tokens += 1
                if engine.k:  # its plan of no tokens still takes its draw from the stream
                    engine.draw_accepted(1)
                finished.append(req.rid)
        engine.steps_done += 1
        if finished:  # their blocks are freed as they end
            engine.free_blocks += sum(r.blocks for r in self.running if r.done == r.prompt)
            self.running = [r for r in self.running if r.done < r.prompt]
            c.requests_finished += len(finished)
        c.note_usage(engine.num_blocks - engine.free_blocks, engine.num_blocks,
                     len(self.waiting))
        return duration, finished
