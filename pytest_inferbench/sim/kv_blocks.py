"""The engine's KV-block bookkeeping: what a step's decode, prefill chunks and admissions take of
the paged KV cache, and what releasing a request gives back, prefix-cache holds included; an
admission's blocks loaded back from the CPU-DRAM tier and the write-through of computed ones.

`Engine` (`engine.py`) inherits it: the rules stay on the engine's own state (its slot table, free
block count, queues), which the fast paths (`stretch`, `kv_schedule`, the lean instances) read and
mirror. No I/O and no clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections import deque

    import numpy.typing as npt

    from .config import EngineConfig
    from .host_cache import HostCache
    from .prefix_cache import PrefixCache
    from .state import CounterState, Request, SlotTable

__all__ = ["KVBlocks"]


class KVBlocks:
    """Block accounting of `Engine`: the state it works on is the engine's (set in its __init__)."""

    config: EngineConfig
    k: int
    block_size: int
    num_blocks: int
    free_blocks: int
    prefix_cache: PrefixCache | None
    host_cache: HostCache | None
    block_bytes: float
    host_link_bytes_per_s: float
    pending_load_s: float
    slots: SlotTable
    requests: dict[int, Request]
    waiting: deque[int]
    running: list[int]  # slot indices in admission order
    _run_cache: npt.NDArray[np.int64] | None
    counters_state: CounterState
    steps_done: int

    def _preempt(self, slot: int) -> None:
        """Give the request's blocks back and queue it again (`Engine` closes its trace too)."""
        raise NotImplementedError

    @property
    def prefix_block_size(self) -> int:
        """The block size a request's `block_hashes` are cut in (0: no prefix cache)."""
        return self.block_size if self.prefix_cache is not None else 0

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def run_array(self) -> npt.NDArray[np.int64]:
        """The running slots as an array (kept in step with the running set once built: a
        running set of hundreds changes at nearly every step, and building the array from
        the list costs several times what cutting one slot out of it or adding one does).
        A fresh array each change: a caller may hold the one it had."""
        if self._run_cache is None:
            self._run_cache = np.asarray(self.running, dtype=np.int64)
        return self._run_cache

    def _release(self, slot: int, req: Request) -> None:
        st = self.slots
        self.free_blocks += int(st.blocks[slot] - st.shared[slot])
        if req.held and self.prefix_cache is not None:
            # Its cached blocks stay resident for whoever comes next, free unless pinned.
            self.free_blocks += self.prefix_cache.release(req.block_hashes[:req.held])
            req.held = 0
        at = self.running.index(slot)
        del self.running[at]
        if self._run_cache is not None:
            self._run_cache = np.concatenate((self._run_cache[:at], self._run_cache[at + 1:]))
        self.slots.free(slot)

    def note_usage(self) -> None:
        """After a step or a stretch: evict cached blocks the allocations took the room of,
        and note the peaks."""
        if self.prefix_cache is not None:
            self.prefix_cache.trim(self.free_blocks)
        self.counters_state.note_usage(self.num_blocks - self.free_blocks, self.num_blocks,
                                       len(self.waiting))

    def _schedule_decode(self) -> tuple[npt.NDArray[np.int64], int]:
        """Decode first, in admission order; preempt from the back when blocks run out."""
        st = self.slots
        q = self.k + 1
        budget = self.config.max_num_batched_tokens
        run = self.run_array()
        dec = run[st.decoding[run]] if len(run) else run
        # More decoders than the token budget holds: the first ones in admission order decode,
        # the rest wait for a later step (the loop below does the same, one slot at a time).
        head = dec if len(dec) * q <= budget else dec[:budget // q]
        need = -(-(st.ctx[head] + q) // self.block_size) - st.blocks[head]
        need = np.maximum(need, 0)
        total = int(need.sum())
        if total <= self.free_blocks:  # the common case: every decoder's blocks fit
            self.free_blocks -= total
            st.blocks[head] += need
            return head, budget - len(head) * q
        # Blocks run short: preempt from the back of the running set (the newest first) until
        # the decoders in front fit. Scanning decoders in admission order and preempting the
        # newest request while one does not fit leaves the longest prefix of the running set
        # whose decoders' needs fit in the free blocks plus the blocks of everything behind it
        # (the need of a prefix only grows and the blocks behind it only shrink as it grows).
        bs = self.block_size
        is_decoder = st.decoding[run]
        counted = is_decoder & (np.cumsum(is_decoder) <= budget // q)  # within the budget
        need_all = np.where(counted, np.maximum(-(-(st.ctx[run] + q) // bs) - st.blocks[run],
                                                0), 0)
        prefix_need = np.concatenate(([0], np.cumsum(need_all)))
        # What preempting frees for sure: the blocks it owns (shared ones may stay pinned).
        owned = st.blocks[run] - st.shared[run]
        behind = np.concatenate((np.cumsum(owned[::-1])[::-1], [0]))
        keep = int(np.flatnonzero(prefix_need <= self.free_blocks + behind)[-1])
        for slot in run[keep:][::-1].tolist():
            self._preempt(slot)  # newest first, each to the front of the waiting queue
        decode = run[:keep][counted[:keep]]
        need = need_all[:keep][counted[:keep]]
        self.free_blocks -= int(need.sum())
        st.blocks[decode] += need
        return decode, budget - len(decode) * q

    def _schedule_prefill(self, slot: int, budget: int, chunks: list[tuple[int, int]]) -> int:
        st = self.slots
        done = int(st.prefilled[slot])
        chunk = min(int(st.target[slot]) - done, budget)
        # The chunk's blocks are taken whole or not at all (vLLM V1's allocate_slots): a
        # prefill whose chunk does not fit waits, holding what it has, rather than computing
        # a sliver the next decoder's block would preempt.
        if chunk <= 0 or (int(st.blocks[slot]) + self.free_blocks) * self.block_size < (
                done + chunk):
            return 0
        need = self._blocks_for(done + chunk) - int(st.blocks[slot])
        self.free_blocks -= need
        st.blocks[slot] += need
        chunks.append((slot, chunk))
        return chunk

    def _admit_waiting(self, budget: int, chunks: list[tuple[int, int]]) -> int:
        """Admit waiting requests FCFS while a slot, the budget and their first chunk's blocks
        allow; returns the budget left."""
        st = self.slots
        while self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            req = self.requests[self.waiting[0]]
            target = req.prompt_tokens + req.generated
            if self._blocks_for(target if req.kv_ready else min(target, budget)
                                ) > self.free_blocks:
                break
            self.waiting.popleft()
            slot = st.admit(req.rid, target, req.generated)
            req.slot = slot
            if req.first_scheduled < 0:
                req.first_scheduled = self.steps_done
            self.running.append(slot)
            if self._run_cache is not None:
                self._run_cache = np.append(self._run_cache, slot)
            if req.kv_ready:
                budget -= self._admit_with_kv(slot, req, chunks)
            else:
                if req.block_hashes:
                    self._reuse_cached(slot, req)
                budget -= self._schedule_prefill(slot, budget, chunks)
        return budget

    def _reuse_cached(self, slot: int, req: Request) -> None:
        """Admission: take the leading prompt blocks the cache holds instead of computing them
        (at least the last prompt token is computed, for its logits, as vLLM does)."""
        cache = self.prefix_cache
        assert cache is not None  # requests carry hashes only with a cache
        st = self.slots
        bs = self.block_size
        cache.trim(self.free_blocks)  # what this step's allocations so far took the room of
        reusable = (req.prompt_tokens - 1) // bs
        hit = min(cache.match(req.block_hashes), reusable)
        c = self.counters_state
        c.prefix_queries += req.prompt_tokens
        c.prefix_hits += hit * bs
        if hit:
            self.free_blocks -= cache.acquire(req.block_hashes[:hit])
            req.held = hit
        loaded = self._load_from_host(req, hit, reusable)
        if not hit + loaded:
            return
        st.blocks[slot] = hit + loaded
        st.shared[slot] = hit
        st.ctx[slot] = st.prefilled[slot] = (hit + loaded) * bs

    def _load_from_host(self, req: Request, hit: int, reusable: int) -> int:
        """The blocks after the HBM hit that the DRAM tier holds, copied back into blocks of
        the request's own (they join the HBM cache with the rest of its prompt); their copy
        time is added to this step (`pending_load_s`). Returns how many."""
        host = self.host_cache
        if host is None:
            return 0
        c = self.counters_state
        c.host_queries += req.prompt_tokens - hit * self.block_size
        want = req.block_hashes[hit:reusable]
        loaded = min(host.match(want), self.free_blocks)
        if loaded <= 0:
            return 0
        host.load(want[:loaded])
        self.free_blocks -= loaded
        c.host_hits += loaded * self.block_size
        self.pending_load_s += loaded * self.block_bytes / self.host_link_bytes_per_s
        return loaded

    def _cache_prompt(self, slot: int, req: Request) -> None:
        """Prefill done: its prompt's full blocks join the cache (a block another request
        cached meanwhile is shared, and this one's copy freed)."""
        cache = self.prefix_cache
        assert cache is not None
        new = req.block_hashes[req.held:]
        if not new:
            return
        if self.host_cache is not None and self.config.kv_offload is not None \
                and self.config.kv_offload.write_through:
            # Copied to DRAM as computed, not only when HBM evicts them.
            self.host_cache.store_many(new)
        present, woken = cache.insert(req.block_hashes, req.held)
        self.free_blocks += present - woken
        self.slots.shared[slot] += len(new)
        req.held += len(new)

    def _admit_with_kv(self, slot: int, req: Request, chunks: list[tuple[int, int]]) -> int:
        """Its KV arrived: hold the prompt's blocks, compute nothing, sample the first token
        (a chunk of no tokens that completes the prefill). A later preemption recomputes."""
        st = self.slots
        tokens = int(st.target[slot])
        blocks = self._blocks_for(tokens)
        self.free_blocks -= blocks
        st.blocks[slot] = blocks
        st.ctx[slot] = st.prefilled[slot] = tokens
        req.kv_ready = False
        chunks.append((slot, 0))
        return 1

    def can_admit(self) -> bool:
        """Would the next step admit (part of) the first waiting request?"""
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return False
        req = self.requests[self.waiting[0]]
        budget = self.config.max_num_batched_tokens - len(self.running) * (self.k + 1)
        if budget <= 0:
            return False
        target = req.prompt_tokens + req.generated
        first = self._blocks_for(target if req.kv_ready else min(target, budget))
        # Each running sequence grows by at most ceil(q / block_size) blocks per step.
        if first + len(self.running) * self._blocks_for(self.k + 1) <= self.free_blocks:
            return True
        st = self.slots
        run = self.run_array()
        grow = int(np.maximum(-(-(st.ctx[run] + self.k + 1) // self.block_size) - st.blocks[run],
                              0).sum())
        return first + grow <= self.free_blocks
