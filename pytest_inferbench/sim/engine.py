"""The simulated serving engine: iteration-level continuous batching, no I/O and no clock.

Like vLLM V1 / ATOM: an FCFS waiting queue; a running set of at most `max_num_seqs`; each step
spends a `max_num_batched_tokens` budget on decode tokens first, then chunked prefill of running
and newly admitted requests; a paged KV cache of `block_size`-token blocks whose size is HBM x
`gpu_memory_utilization` minus the weights (per GPU); when a decode step finds no free block the
most recently admitted request is preempted and later recomputed. Each step's duration comes
from `physics.StepCost`. The running set lives in numpy slot arrays so `stretch.advance()` can
price and apply a whole stretch of identical decode steps at once.
The block accounting (decode and prefill blocks, admissions, prefix-cache holds, releases) is
`kv_blocks.KVBlocks`, which `Engine` inherits. With a CPU-DRAM tier below the prefix cache
(`host_cache.py`, sized by the argv's offload flags), a step that admits prompts found there
takes their copy to HBM over the host link longer.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..frameworks.specdecode import THINKING_OFF, THINKING_ON
from ..recipe import golden
from . import catalog
from .acceptance import AcceptanceSampler, SpecConfig, SpecConfigError, resolve_distribution
from .config import EngineConfig
from .host_cache import HostCache
from .kv_blocks import KVBlocks
from .physics import EngineConfigError, PrefillTerms, StepCost, kv_capacity_tokens, shard_model
from .prefix_cache import PrefixCache
from .state import (
    CounterState,
    EngineCounters,
    Request,
    SlotTable,
    StepBatch,
    StepResult,
    plan_draws,
)

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["Engine", "EngineConfig", "EngineCounters", "RequestRejectedError", "StepBatch",
           "StepResult"]


_NO_DRAFTS = np.zeros(0, np.int64)


class RequestRejectedError(ValueError):
    """The request can never run (too long for max_model_len or the KV cache)."""


@dataclass(frozen=True)
class Trace:
    """Where a finished request's tokens went: global step indices and tokens per step."""

    steps: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.int64]
    arrival_step: int  # steps completed when the request was added
    first_scheduled_step: int  # index of the step that first computed part of its prompt


def draft_checkpoint(name: str | None, target: catalog.Checkpoint) -> catalog.Checkpoint:
    """The draft model's checkpoint; without a name, the catalog's draft for the target."""
    arch = target.architecture.name
    if name is None and target.architecture.mtp_layers:
        return catalog.mtp_draft(target)
    if name is None:
        drafts = [c for c in catalog.checkpoint_names()
                  if catalog.checkpoint(c).draft_for == arch]
        if not drafts:
            raise EngineConfigError(f"no draft model known for {arch}: give one "
                                    "(--draft-model / speculative-config model)")
        name = drafts[0]
    draft = catalog.checkpoint(name)
    if draft.draft_for not in (None, arch):
        raise EngineConfigError(f"draft model {draft.name} drafts for {draft.draft_for}, "
                                f"not for {target.name} ({arch})")
    return draft


def _golden_al(architecture: str, spec: SpecConfig) -> float:
    """The packaged golden AL the engine aims at when the launch spec forces none."""
    mode = THINKING_ON if spec.thinking else THINKING_OFF
    try:
        return golden.packaged().require(architecture, spec.method, mode,
                                         spec.num_speculative_tokens)
    except golden.GoldenALError as exc:
        # A native MTP head with no golden curve: the catalog's per-position rate.
        mtp = (catalog.mtp_acceptance_length(architecture, spec.num_speculative_tokens)
               if spec.draft_model is None else None)
        if mtp is None:
            raise SpecConfigError(str(exc)) from None
        return mtp


class Engine(KVBlocks):
    def __init__(self, config: EngineConfig, *, keep_traces: bool = False) -> None:
        self.config = config
        hw = catalog.hardware(config.hardware)
        fw = catalog.framework(config.framework)
        ckpt = catalog.checkpoint(config.model)
        self.target = shard_model(ckpt, hw, tp=config.tp, dp_attn=config.dp_attn,
                                  kv_dtype=config.kv_cache_dtype, online_quant=config.online_quant)
        spec = config.spec
        self.k = spec.num_speculative_tokens if spec else 0
        draft = None
        probs: tuple[float, ...] = (1.0,)
        if spec:
            draft_ckpt = draft_checkpoint(spec.draft_model, ckpt)
            draft = shard_model(draft_ckpt, hw, tp=config.tp,
                                dp_attn=config.dp_attn, kv_dtype=config.kv_cache_dtype,
                                online_quant=None)
            probs = resolve_distribution(spec, lambda: _golden_al(ckpt.architecture.name, spec))
        self.accepted_distribution = probs
        self._min_emit = 1 + next(i for i, p in enumerate(probs) if p > 0)
        self.cost = StepCost.build(target=self.target, draft=draft, k=self.k, tp=config.tp,
                                   ep=config.ep > 1, hw=hw, fw=fw, dp_attn=config.dp_attn,
                                   efficiency=config.efficiency,
                                   cuda_graphs=config.cuda_graphs, pp=config.pp)
        models = [self.target] + ([draft] if draft else [])
        self.kv_capacity_tokens = kv_capacity_tokens(
            hw=hw, models=models, gpu_memory_utilization=config.gpu_memory_utilization,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs, free_fraction=config.kv_cache_free_fraction,
            pp=config.pp)
        if config.max_total_tokens is not None:
            self.kv_capacity_tokens = min(self.kv_capacity_tokens, config.max_total_tokens)
        self.block_size = config.block_size
        self.num_blocks = self.kv_capacity_tokens // config.block_size
        self.window = self.target.window
        rng = np.random.default_rng(config.seed)
        self._sampler = AcceptanceSampler(probs, np.random.default_rng(rng.integers(2**63)))
        self._jitter_rng = np.random.default_rng(rng.integers(2**63))
        self.slots = SlotTable(config.max_num_seqs, self.k)
        self.requests: dict[int, Request] = {}
        self.waiting: deque[int] = deque()
        self.running: list[int] = []  # slot indices in admission order
        self._run_cache: npt.NDArray[np.int64] | None = None
        self.free_blocks = self.num_blocks
        # KV bytes of one block on one GPU (target and draft): what a DRAM copy moves.
        self.block_bytes = float(sum(m.kv_store_per_token for m in models)) * self.block_size
        self.host_link_bytes_per_s = hw.host_link_bytes_per_s
        self.host_cache = self._host_cache(config) if config.prefix_caching else None
        self.prefix_cache = PrefixCache(self.host_cache) if config.prefix_caching else None
        self.pending_load_s = 0.0  # DRAM load-backs of this step's admissions
        self.steps_done = 0
        self.counters_state = CounterState.zero(self.k)
        self.keep_traces = keep_traces
        # A caller that reads traces (the virtual driver) can skip the per-step emitted list.
        self.report_emitted = True
        self.traces: dict[int, Trace] = {}

    def _host_cache(self, config: EngineConfig) -> HostCache | None:
        """The CPU-DRAM tier the argv asks for: its bytes per GPU in blocks (SGLang's ratio
        mode: a multiple of the HBM pool)."""
        offload = config.kv_offload
        if offload is None:
            return None
        blocks = (int(offload.bytes_per_rank // self.block_bytes) if offload.bytes_per_rank
                  else int(offload.hbm_ratio * self.num_blocks))
        return HostCache(blocks)

    # ----------------------------------------------------------------- requests
    def add_request(self, request_id: int, prompt_tokens: int, max_tokens: int, *,
                    kv_ready: bool = False, block_hashes: tuple[int, ...] = (),
                    session: object = None) -> None:
        """Queue a request; `kv_ready`: its prompt's KV cache was computed elsewhere (a
        disaggregated prefill instance) and arrives with it; `block_hashes`: the content
        hashes of its prompt's full `block_size` blocks, for the prefix cache; `session`:
        unused, one engine being the only place a session can go (a `Cluster` keeps it)."""
        cfg = self.config
        if request_id in self.requests:
            raise ValueError(f"request id {request_id} is already in the engine")
        if prompt_tokens < 1 or max_tokens < 1:
            raise RequestRejectedError("prompt_tokens and max_tokens must be at least 1")
        if prompt_tokens + max_tokens > cfg.max_model_len:
            raise RequestRejectedError(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, "
                f"you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
                f"messages, {max_tokens} in the completion).")
        if self._blocks_for(prompt_tokens + max_tokens + self.k) > self.num_blocks:
            raise RequestRejectedError(
                f"request of {prompt_tokens + max_tokens} tokens exceeds the KV cache "
                f"({self.num_blocks} blocks of {self.block_size} tokens)")
        self.requests[request_id] = Request(
            request_id, prompt_tokens, max_tokens, arrival_step=self.steps_done,
            kv_ready=kv_ready,
            block_hashes=block_hashes[:prompt_tokens // self.block_size]
            if self.prefix_cache is not None else ())
        self.waiting.append(request_id)

    def abort_request(self, request_id: int) -> None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        if req.slot >= 0:
            self._end_admission(req)  # its verify steps stay in the counters
            self._release(req.slot, req)
        else:
            self.waiting.remove(request_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def counters(self) -> EngineCounters:
        used = self.num_blocks - self.free_blocks
        running = self.run_array()
        open_hist = self.slots.open_histogram(running[self.slots.decoding[running]])
        snapshot = self.counters_state.snapshot(
            open_histogram=open_hist,
            running=len(self.running), waiting=len(self.waiting), blocks_used=used,
            blocks_total=self.num_blocks, steps=self.steps_done)
        host = self.host_cache
        if host is None:
            return snapshot
        written = host.written_blocks * self.block_bytes
        read = host.loaded_blocks * self.block_bytes
        return replace(snapshot, host_tier=True,
                       host_tokens_used=host.used_blocks * self.block_size,
                       host_tokens_total=host.capacity_blocks * self.block_size,
                       offload_bytes_written=int(written), offload_bytes_read=int(read),
                       offload_seconds_written=written / self.host_link_bytes_per_s,
                       offload_seconds_read=read / self.host_link_bytes_per_s)

    def pop_trace(self, request_id: int) -> Trace:
        return self.traces.pop(request_id)

    # ----------------------------------------------------------------- internals
    def _end_admission(self, req: Request) -> None:
        """Close the request's run of consecutive emitting steps into its trace."""
        s = req.slot
        req.generated = int(self.slots.gen[s])
        if self.slots.decoding[s]:
            self.slots.close_histogram(s, self.counters_state)
            if self.keep_traces:
                req.add_segment(int(self.slots.first_step[s]), self.slots.emitted_tokens(s))

    def _preempt(self, slot: int) -> None:
        req = self.requests[int(self.slots.rid[slot])]
        self._end_admission(req)
        self._release(slot, req)
        req.slot = -1
        self.waiting.appendleft(req.rid)
        self.counters_state.preemptions += 1

    def _finish(self, slot: int, finished: list[int]) -> None:
        req = self.requests.pop(int(self.slots.rid[slot]))
        self._end_admission(req)
        self._release(slot, req)
        self.counters_state.requests_finished += 1
        finished.append(req.rid)
        if self.keep_traces:
            steps, tokens = req.trace_arrays()
            self.traces[req.rid] = Trace(steps, tokens, req.arrival_step, req.first_scheduled)

    def finish_done(self, candidates: npt.NDArray[np.int64] | None = None) -> list[int]:
        """Retire every decoding request whose plan is complete (after a step).

        `candidates`: the only slots that can have completed (those the step advanced or
        started decoding); every other running request was checked after its last step.
        """
        st = self.slots
        finished: list[int] = []
        if not self.running:
            return finished
        run = self.run_array() if candidates is None else candidates
        done = run[st.decoding[run] & (st.p[run] >= st.plan_steps[run])].tolist()
        if candidates is not None and len(done) > 1:
            done.sort(key=st.order.__getitem__)  # admission order, as over the whole set
        for slot in done:
            self._finish(slot, finished)
        return finished

    def draw_decode_plans(self, max_tokens: npt.NDArray[np.int64]) -> None:
        """Draw the decode plans of requests that run start to end without a preemption
        (their first token from the prefill), as running them would."""
        if self.k and len(max_tokens):
            self._sampler.skip(int(plan_draws(max_tokens - 1, self._min_emit).sum()))

    def draw_accepted(self, n: int) -> npt.NDArray[np.int64]:
        """The next n accepted-draft counts of its acceptance stream."""
        drawn: npt.NDArray[np.int64] = self._sampler.draw(n).astype(np.int64)
        return drawn

    def _start_decoding(self, slot: int, req: Request) -> None:
        """Prefill done: its step emitted one token; draw the rest of this admission's plan."""
        remaining = req.max_tokens - int(self.slots.gen[slot])
        accepted = (self.draw_accepted(plan_draws(remaining, self._min_emit)) if self.k
                    else _NO_DRAFTS)
        self.slots.start_decode(slot, remaining, accepted, first_step=self.steps_done)

    def jitter(self, n: int) -> npt.NDArray[np.float64] | float:
        """Per-step duration factors (1.0 without jitter)."""
        sigma = self.config.jitter
        if sigma <= 0:
            return 1.0
        return np.clip(self._jitter_rng.lognormal(0.0, sigma, n), 0.3, 3.0)

    @property
    def min_emit(self) -> int:
        """Tokens every decode step emits at least (1 + the fewest drafts ever accepted)."""
        return self._min_emit

    def random_streams(self) -> tuple[AcceptanceSampler, np.random.Generator]:
        """Copies of the acceptance and jitter streams: a planner draws from them and hands
        them back with `adopt_random_streams` only if its plan is used."""
        return copy.deepcopy(self._sampler), copy.deepcopy(self._jitter_rng)

    def adopt_random_streams(self, sampler: AcceptanceSampler,
                             jitter_rng: np.random.Generator) -> None:
        self._sampler, self._jitter_rng = sampler, jitter_rng

    # ----------------------------------------------------------------- one step
    def step(self) -> StepResult:
        """Schedule and run one iteration; returns its duration and what it emitted."""
        st = self.slots
        decode, budget = self._schedule_decode()
        # Chunked prefill: running requests still prefilling, then admissions (FCFS).
        chunks: list[tuple[int, int]] = []
        run = self.run_array()
        for slot in run[~st.decoding[run]].tolist():
            if budget <= 0:
                break
            budget -= self._schedule_prefill(slot, budget, chunks)
        budget = self._admit_waiting(budget, chunks)
        if not len(decode) and not chunks and self.running:
            # Every running request is a chunked prefill stuck without blocks: free the
            # newest so the older ones can finish (vLLM preempts the same way).
            self._preempt(self.running[-1])
            self.steps_done += 1  # an empty step: step indices stay aligned with durations
            return StepResult(0.0, [], [])
        factor = self.jitter(1)
        duration = self._price(decode, chunks) * (
            factor if isinstance(factor, float) else float(factor[0]))
        # The admissions' DRAM hits are copied to HBM before the step computes on them.
        duration += self.pending_load_s
        self.pending_load_s = 0.0
        # Apply: the step's tokens exist when it ends.
        c = self.counters_state
        emitted: list[tuple[int, int]] = []
        if len(decode):
            tokens = st.advance_decode(decode, 1, c)
            if self.report_emitted:
                emitted = list(zip(st.rid[decode].tolist(), tokens.tolist(), strict=True))
        started: list[int] = []
        for slot, n in chunks:
            st.ctx[slot] += n
            st.prefilled[slot] += n
            if st.prefilled[slot] == st.target[slot]:
                req = self.requests[int(st.rid[slot])]
                if req.block_hashes:
                    self._cache_prompt(slot, req)
                if st.gen[slot] == 0:
                    c.prompt_tokens += req.prompt_tokens
                st.gen[slot] += 1
                c.generation_tokens += 1
                emitted.append((req.rid, 1))
                self._start_decoding(slot, req)
                started.append(slot)
        self.steps_done += 1
        finished = self.finish_done(
            np.concatenate([decode, np.asarray(started, dtype=np.int64)]) if started
            else decode)
        self.note_usage()
        return StepResult(duration, emitted, finished)

    def _price(self, decode: npt.NDArray[np.int64], chunks: list[tuple[int, int]]) -> float:
        st = self.slots
        w = self.window
        ctx = st.ctx[decode]
        ctx_cap = float(self.config.max_model_len + self.k + 1)
        terms = PrefillTerms(w)
        for slot, n in chunks:
            terms.add(float(st.ctx[slot]), n, bool(st.prefilled[slot] + n == st.target[slot]))
        return self.cost.step_with(
            float(len(decode)), float(ctx.sum()),
            float(np.minimum(ctx, w).sum()) if w < ctx_cap else float(ctx.sum()), terms)

