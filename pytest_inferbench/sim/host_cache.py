"""The CPU-DRAM tier of the prefix cache: blocks HBM let go of, kept by hash, least recently
used evicted first.

The HBM prefix cache (`prefix_cache.py`) writes a block here when it evicts it (and, under a
write-through policy, the engine writes each block as its prefill completes); a request whose
leading blocks past the HBM hit are here loads them back instead of computing them. It counts
blocks only: the engine turns them into bytes and seconds (`Engine.counters`). No clock: the
order of use is the recency.
"""

from __future__ import annotations

from collections import OrderedDict
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
        n = 0
        for h in hashes:
            if h not in self._lru:
                break
            n += 1
        return n

    def load(self, hashes: Sequence[int]) -> None:
        """Copy these blocks (here) back to HBM; they stay here, most recently used."""
        for h in hashes:
            self._lru.move_to_end(h)
        self.loaded_blocks += len(hashes)

    def store(self, h: int) -> None:
        """Keep a block HBM holds or lets go of: written unless here already (then only used)."""
        if h in self._lru:
            self._lru.move_to_end(h)
            return
        if not self.capacity_blocks:
            return
        self._lru[h] = None
        self.written_blocks += 1
        if len(self._lru) > self.capacity_blocks:
            self._lru.popitem(last=False)
            self.evictions += 1
