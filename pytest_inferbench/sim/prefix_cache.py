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
    from collections.abc import Callable, Sequence

    from .host_cache import HostCache

__all__ = ["PrefixCache", "block_hashes"]

# A hash stands for its block and all before it, and a request pins the leading run of its
# blocks: whoever pins a block pins all blocks before it, so along a request's blocks the pin
# counts never grow. Its blocks held by others, or pinned at all, are a leading run, found by
# bisection; the rest change in one C-level step (an engine page may be one token: SGLang's
# prompts have thousands of blocks).


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
        refs, idle = self._refs, self._idle
        if not self.evictions:
            # Nothing ever left: every block a request pinned or cached is resident with all
            # blocks before it (a hash stands for its block and everything before it, and a
            # request caches the whole leading run of its prompt), so the resident ones are a
            # leading run of `hashes` and a bisection finds its end (an engine page may be one
            # token: a prompt of thousands of blocks costs a dozen lookups, not thousands).
            return _leading_run(hashes, lambda h: h in refs or h in idle)
        n = 0
        for h in hashes:
            if h not in refs and h not in idle:
                break
            n += 1
        return n

    def acquire(self, hashes: Sequence[int]) -> int:
        """Pin resident blocks for one more request; returns how many were idle (free)."""
        refs = self._refs
        pinned = _leading_run(hashes, refs.__contains__)
        for h in hashes[:pinned]:
            refs[h] += 1
        self._wake(hashes[pinned:])
        return len(hashes) - pinned

    def insert(self, hashes: Sequence[int]) -> tuple[int, int]:
        """A request computed these blocks and holds them: cache the new ones (the request's
        blocks become the cache's) and pin the ones resident already (its own copy is freed).
        Returns (resident already, of which idle): the engine frees the request's copies."""
        refs, idle = self._refs, self._idle
        if not self.evictions:  # pinned, idle, new: three runs (`match`)
            pinned = _leading_run(hashes, refs.__contains__)
            resident = self.match(hashes)
            for h in hashes[:pinned]:
                refs[h] += 1
            self._wake(hashes[pinned:resident])
            refs.update(dict.fromkeys(hashes[resident:], 1))
            return resident, resident - pinned
        present = woken = 0
        for h in hashes:
            if h in refs:
                refs[h] += 1
                present += 1
            elif h in idle:
                del idle[h]
                refs[h] = 1
                present += 1
                woken += 1
            else:
                refs[h] = 1
        return present, woken

    def release(self, hashes: Sequence[int]) -> int:
        """One request lets go of these blocks; returns how many nobody holds now (they stay
        resident, most recently used, and count as free)."""
        refs = self._refs
        shared = _leading_run(hashes, lambda h: refs[h] > 1)
        for h in hashes[:shared]:
            refs[h] -= 1
        freed = hashes[shared:]
        deque(map(refs.__delitem__, freed), maxlen=0)
        # In the order given: the request's later blocks are the more recently used.
        self._idle.update(dict.fromkeys(freed))
        return len(freed)

    def _wake(self, hashes: Sequence[int]) -> None:
        """Idle blocks pinned by one request."""
        deque(map(self._idle.__delitem__, hashes), maxlen=0)
        self._refs.update(dict.fromkeys(hashes, 1))

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


def _leading_run(hashes: Sequence[int], holds: Callable[[int], bool]) -> int:
    """The length of the leading run of `hashes` for which `holds` is true, where it is true
    of a leading run and false after it."""
    lo, hi = 0, len(hashes)
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(hashes[mid]):
            lo = mid + 1
        else:
            hi = mid
    return lo
