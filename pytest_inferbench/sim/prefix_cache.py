"""The prefix cache: full prompt blocks kept by content hash, evicted least recently used.

Like vLLM's automatic prefix caching (and SGLang's radix cache at page granularity): a full
block of prompt tokens is known by a hash of its content and everything before it, so a
request reuses the leading run of its blocks that are resident. A block referenced by a running
request is pinned; when its last reference goes it stays resident but counts as free (vLLM's
free queue holds cached blocks) until an allocation needs the room, oldest first.

The engine keeps the block counts (`Engine.free_blocks`, `SlotTable.blocks`); this keeps only
which hashes are resident and who holds them. One dict entry per cached block, no clock: the
order of release is the recency. With a CPU-DRAM tier (`host_cache.HostCache`) an evicted block
is written there instead of dropped.
"""

from __future__ import annotations

from collections import deque
from itertools import islice
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .host_cache import HostCache

__all__ = ["PrefixCache", "block_hashes"]


def block_hashes(tokens: Sequence[str], block_size: int) -> tuple[int, ...]:
    """The hash of each full block of a prompt's tokens, each standing for its block and every
    block before it (the HTTP server's prompts: the simulator's tokens are words)."""
    out: list[int] = []
    h = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hash((h, *tokens[start:start + block_size]))
        out.append(h)
    return tuple(out)


class PrefixCache:
    def __init__(self, host: HostCache | None = None) -> None:
        self.host = host  # where evicted blocks go (None: they are dropped)
        self._refs: dict[int, int] = {}  # pinned: hash -> running requests holding it
        # Unpinned, least recent first: a plain dict keeps insertion order and, unlike an
        # OrderedDict, adds and removes keys without a linked list to keep up.
        self._idle: dict[int, None] = {}
        self.evictions = 0

    @property
    def idle_blocks(self) -> int:
        """Resident blocks no running request holds (counted as free by the engine)."""
        return len(self._idle)

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of `hashes` are resident."""
        if not self.evictions:
            # Nothing ever left: every block a request pinned or cached is resident with all
            # blocks before it (a hash stands for its block and everything before it, and a
            # request caches the whole leading run of its prompt), so the resident ones are a
            # leading run of `hashes` and a bisection finds its end (an engine page may be one
            # token: a prompt of thousands of blocks costs a dozen lookups, not thousands).
            lo, hi = 0, len(hashes)
            while lo < hi:
                mid = (lo + hi) // 2
                h = hashes[mid]
                if h in self._refs or h in self._idle:
                    lo = mid + 1
                else:
                    hi = mid
            return lo
        n = 0
        for h in hashes:
            if h not in self._refs and h not in self._idle:
                break
            n += 1
        return n

    def acquire(self, hashes: Sequence[int]) -> int:
        """Pin resident blocks for one more request; returns how many were idle (free)."""
        woken = 0
        for h in hashes:
            if h in self._idle:
                del self._idle[h]
                self._refs[h] = 1
                woken += 1
            else:
                self._refs[h] += 1
        return woken

    def insert(self, hashes: Sequence[int]) -> tuple[int, int]:
        """A request computed these blocks and holds them: cache the new ones (the request's
        blocks become the cache's) and pin the ones resident already (its own copy is freed).
        Returns (resident already, of which idle): the engine frees the request's copies."""
        present = woken = 0
        for h in hashes:
            if h in self._refs:
                self._refs[h] += 1
                present += 1
            elif h in self._idle:
                del self._idle[h]
                self._refs[h] = 1
                present += 1
                woken += 1
            else:
                self._refs[h] = 1
        return present, woken

    def release(self, hashes: Sequence[int]) -> int:
        """One request lets go of these blocks; returns how many nobody holds now (they stay
        resident, most recently used, and count as free)."""
        freed = 0
        for h in hashes:
            left = self._refs[h] - 1
            if left:
                self._refs[h] = left
            else:
                del self._refs[h]
                self._idle[h] = None
                freed += 1
        return freed

    def trim(self, free_blocks: int) -> None:
        """Evict the least recently used idle blocks until they fit in the free blocks (an
        allocation took the room they were in)."""
        over = len(self._idle) - max(free_blocks, 0)
        if over <= 0:
            return
        evicted = list(islice(self._idle, over))  # least recent first
        deque(map(self._idle.__delitem__, evicted), maxlen=0)
        self.evictions += over
        if self.host is not None:
            for h in evicted:
                self.host.store(h)
