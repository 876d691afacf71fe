"""The CPU-DRAM tier of the prefix cache: blocks HBM let go of, kept by hash, least recently
used evicted first.

The HBM prefix cache (`prefix_cache.py`) writes a block here when it evicts it (and, under a
write-through policy, the engine writes each block as its prefill completes); a request whose
leading blocks past the HBM hit are here loads them back instead of computing them. It counts
blocks only: the engine turns them into bytes and seconds (`Engine.counters`). No clock: the
order of use is the recency.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["HostCache"]


class HostCache:
    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = max(capacity_blocks, 0)
        self._lru: OrderedDict[int, None] = OrderedDict()  # least recent first
        self.written_blocks = 0  # copies HBM -> DRAM
        self.loaded_blocks = 0  # copies DRAM -> HBM
        self.evictions = 0

    @property
    def used_blocks(self) -> int:
        return len(self._lru)

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of `hashes` are here."""
        here = list(map(self._lru.__contains__, hashes))  # in C: a prompt may be 1-token pages
        return here.index(False) if False in here else len(here)

    def load(self, hashes: Sequence[int]) -> None:
        """Copy these blocks (here) back to HBM; they stay here, most recently used."""
        deque(map(self._lru.move_to_end, hashes), maxlen=0)
        self.loaded_blocks += len(hashes)

    def store_many(self, hashes: Sequence[int]) -> None:
        """Keep blocks HBM holds or lets go of, in order: each written unless here already
        (then only used)."""
        if not self.capacity_blocks:
            return
        lru, capacity = self._lru, self.capacity_blocks
        written = evicted = 0
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = None
            written += 1
            if len(lru) > capacity:
                lru.popitem(last=False)
                evicted += 1
        self.written_blocks += written
        self.evictions += evicted

    def store(self, h: int) -> None:
        """Keep one block (`store_many`)."""
        self.store_many((h,))
