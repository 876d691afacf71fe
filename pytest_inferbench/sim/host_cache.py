"""The CPU-DRAM tier of the prefix cache: blocks HBM let go of, kept by hash, least recently
used evicted first.

The HBM prefix cache (`prefix_cache.py`) writes a block here when it evicts it (and, under a
write-through policy, the engine writes each block as its prefill completes); a request whose
leading blocks past the HBM hit are here loads them back instead of computing them. It counts
blocks only: the engine turns them into bytes and seconds (`Engine.counters`). No clock: the
order of use is the recency.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import TYPE_CHECKING

from .recency_set import RecencySet, leading_found

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["HostCache"]


class HostCache:
    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = max(capacity_blocks, 0)
        # Until the tier is about to fill, nothing is evicted: the blocks here and their order
        # of use are a `RecencySet` (one set look-up a block written, none a block loaded; tens
        # of millions of blocks in a numpy table). Most dram points never fill their tier.
        self._room: RecencySet | None = RecencySet()
        # From then on, the use order as a log of hashes, a block's latest entry its last use:
        # the least recently used block is the first one of the log whose entries are used up.
        # A use appends (no linked list to keep up, as in an OrderedDict, in C for a batch);
        # the log is rewritten when stale entries outnumber. `_uses`: the blocks here -> their
        # entries in the log, for eviction.
        self._log: deque[int] = deque()
        self._uses: dict[int, int] = {}
        self.written_blocks = 0  # copies HBM -> DRAM
        self.loaded_blocks = 0  # copies DRAM -> HBM
        self.evictions = 0

    @property
    def used_blocks(self) -> int:
        return len(self._room) if self._room is not None else len(self._uses)

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of `hashes` are here."""
        if self._room is not None:
            return self._room.leading(hashes)
        uses = self._uses
        if not hashes or hashes[0] not in uses:  # the common miss, before a pass over them all
            return 0
        return leading_found(uses, hashes)

    def load(self, hashes: Sequence[int]) -> None:
        """Copy these blocks (here) back to HBM; they stay here, most recently used."""
        if self._room is not None:
            self._room.use(hashes, here=True)
        else:
            self._use(hashes)
        self.loaded_blocks += len(hashes)

    def store(self, h: int) -> None:
        """Keep one block (`store_many`)."""
        self.store_many((h,))

    def store_many(self, hashes: Sequence[int]) -> None:
        """Keep blocks HBM holds or lets go of, in order: each written unless here already
        (then only used), the least recently used block evicted when one is over."""
        if not self.capacity_blocks or not hashes:
            return
        room = self._room
        if room is not None:
            if len(room) + len(hashes) <= self.capacity_blocks:  # none can be over
                self.written_blocks += room.use(hashes)  # the new ones written, the rest used
                return
            self._count()
        uses = self._uses
        if uses.keys().isdisjoint(hashes):
            if len(uses) + len(hashes) <= self.capacity_blocks:  # a prefill's, written through
                before = len(uses)
                self._log.extend(hashes)
                uses.update(dict.fromkeys(hashes, 1))
                if len(uses) - before < len(hashes):  # a block twice: written once, then used
                    uses.update((h, n) for h, n in Counter(hashes).items() if n > 1)
                self.written_blocks += len(uses) - before
                self._compact()
                return
        elif all(map(uses.__contains__, hashes)):  # HBM evicting what it wrote through
            self._use(hashes)
            return
        for h in hashes:  # one at a time
            if h in uses:
                self._use((h,))
                continue
            self._log.append(h)
            uses[h] = 1
            self.written_blocks += 1
            if len(uses) > self.capacity_blocks:
                self._evict_one()

    def _use(self, hashes: Sequence[int]) -> None:
        """These blocks (here, counted) are the most recently used, in this order."""
        uses = self._uses
        if len(set(hashes)) == len(hashes):
            uses.update(zip(hashes, map((1).__add__, map(uses.__getitem__, hashes)), strict=True))
        else:
            for h in hashes:
                uses[h] += 1
        self._log.extend(hashes)
        self._compact()

    def _evict_one(self) -> None:
        log, uses = self._log, self._uses
        while True:
            h = log.popleft()
            left = uses[h] - 1
            if left:  # used again later
                uses[h] = left
                continue
            del uses[h]
            self.evictions += 1
            return

    def _count(self) -> None:
        """The tier may have to evict from now on: the log is one entry a block (their order
        of use), each block's entry counted."""
        assert self._room is not None
        self._log.extend(self._room.in_order_of_use())
        self._uses = dict.fromkeys(self._log, 1)
        self._room = None

    def _compact(self) -> None:
        """Drop the log's stale entries once they outnumber the blocks (a block's last entry
        kept, in order: the same order of use, in C)."""
        if len(self._log) <= 2 * len(self._uses) + 1024:
            return
        latest = list(dict.fromkeys(reversed(self._log)))
        latest.reverse()
        self._log.clear()  # in place: callers hold them
        self._log.extend(latest)
        self._uses.update(dict.fromkeys(latest, 1))
