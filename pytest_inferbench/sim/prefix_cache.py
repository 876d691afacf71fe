"""The prefix cache: full prompt blocks kept by content hash, evicted least recently used.

Like vLLM's automatic prefix caching (and SGLang's radix cache at page granularity): a full
block of prompt tokens is known by a hash of its content and everything before it, so a
request reuses the leading run of its blocks that are resident. A block referenced by a running
request is pinned; when its last reference goes it stays resident but counts as free (vLLM's
free queue holds cached blocks) until an allocation needs the room, oldest first.

The engine keeps the block counts (`Engine.free_blocks`, `SlotTable.blocks`); this keeps only
which hashes are resident and who holds them, no clock: the order of release is the recency.
With a CPU-DRAM tier (`host_cache.HostCache`) an evicted block is written there instead of
dropped.

The rules are per block, the bookkeeping is per run of blocks: since a hash stands for its
block and all before it, the resident blocks form a tree (a radix tree, as SGLang keeps), and
a run of blocks with no branch between them, held by the same requests and released together,
is one entry (`_Run`). A turn of an agentic trace pins, caches and releases a few runs, not
each of its blocks (an engine page may be one token: SGLang's prompts have thousands).
Eviction takes the least recently released blocks first, each released run in its blocks'
order, so it may take a run's head and leave its tail resident: such a tail follows an evicted
block (`_orphans`), a lookup cannot reach it, but a request that computes the evicted blocks
again finds it resident.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
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


class _Run:
    """Resident blocks `keys[lo:hi]`, one after the other with no branch between them, all held
    by `refs` running requests (0: idle); `keys[lo - 1]` is the block before (none for a
    prompt's first). `children` are the runs that follow its last block, by their first hash;
    `parent` the run before it (None: the block before was evicted)."""

    __slots__ = ("children", "hi", "keys", "lo", "parent", "refs")

    def __init__(self, keys: Sequence[int], lo: int, hi: int, parent: _Run | None,
                 refs: int) -> None:
        self.keys = keys
        self.lo = lo
        self.hi = hi
        self.parent = parent
        self.refs = refs
        self.children: dict[int, _Run] = {}


class PrefixCache:
    def __init__(self, host: HostCache | None = None) -> None:
        self.host = host  # where evicted blocks go (None: they are dropped)
        self._root = _Run((), 0, 0, None, 0)
        # Idle runs, least recently released first (O(1) removal anywhere and at the head).
        self._idle: OrderedDict[_Run, None] = OrderedDict()
        self._idle_blocks = 0
        # An evicted hash -> the resident runs that followed it (until it is cached again).
        self._orphans: dict[int, dict[int, _Run]] = {}
        self.evictions = 0

    @property
    def idle_blocks(self) -> int:
        """Resident blocks no running request holds (counted as free by the engine)."""
        return self._idle_blocks

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of `hashes` are resident."""
        node, pos, n = self._root, 0, len(hashes)
        while pos < n:
            run = node.children.get(hashes[pos])
            if run is None:
                break
            common = _common(run, hashes, pos)
            pos += common
            if common < run.hi - run.lo:
                break
            node = run
        return pos

    def acquire(self, hashes: Sequence[int]) -> int:
        """Pin resident blocks for one more request; returns how many were idle (free)."""
        woken = 0
        for run in self._path(hashes, len(hashes)):
            if not run.refs:
                self._idle.pop(run, None)
                woken += run.hi - run.lo
            run.refs += 1
        self._idle_blocks -= woken
        return woken

    def insert(self, hashes: Sequence[int], start: int = 0) -> tuple[int, int]:
        """A request that holds `hashes[:start]` computed the blocks `hashes[start:]` and holds
        them: cache the new ones (the request's blocks become the cache's) and pin the ones
        resident already (its own copy is freed). Returns (resident already, of which idle):
        the engine frees the request's copies."""
        held = self._path(hashes, start)
        node = held[-1] if held else self._root
        # Evicted hashes among the new blocks that resident runs followed: caching them again
        # makes those runs reachable (positions, looked up in C, only while there are any).
        back = sorted(hashes.index(h, start) for h in self._orphans.keys() & hashes[start:]) \
            if self._orphans else []
        pos, n = start, len(hashes)
        present = woken = 0
        while pos < n:
            run = node.children.get(hashes[pos])
            if run is None:  # new blocks from here
                node, pos = self._add(node, hashes, pos, back)
                continue
            common = _common(run, hashes, pos)
            if common < run.hi - run.lo:
                run = self._split(run, common)
            present += common
            if not run.refs:
                self._idle.pop(run, None)
                woken += common
            run.refs += 1
            node, pos = run, pos + common
        self._idle_blocks -= woken
        return present, woken

    def release(self, hashes: Sequence[int]) -> int:
        """One request lets go of these blocks; returns how many nobody holds now (they stay
        resident, most recently used, and count as free)."""
        freed = 0
        for run in self._path(hashes, len(hashes)):
            run.refs -= 1
            if not run.refs:
                # In the order given: the request's later blocks are the more recently used.
                self._idle[run] = None
                freed += run.hi - run.lo
        self._idle_blocks += freed
        return freed

    def trim(self, free_blocks: int) -> None:
        """Evict the least recently used idle blocks until they fit in the free blocks (an
        allocation took the room they were in)."""
        over = self._idle_blocks - max(free_blocks, 0)
        if over <= 0:
            return
        self.evictions += over
        self._idle_blocks -= over
        evicted: list[int] = []
        idle = self._idle
        while over:
            run = next(iter(idle))
            size = run.hi - run.lo
            self._detach(run)
            if size <= over:  # all of it: what followed it follows an evicted block now
                del idle[run]
                evicted.extend(run.keys[run.lo:run.hi])
                if run.children:
                    for child in run.children.values():
                        child.parent = None
                    self._orphans[run.keys[run.hi - 1]] = run.children
                over -= size
            else:  # its head: the rest stays idle, first in line, after an evicted block
                evicted.extend(run.keys[run.lo:run.lo + over])
                run.lo += over
                run.parent = None
                self._orphans[run.keys[run.lo - 1]] = {run.keys[run.lo]: run}
                over = 0
        if self.host is not None:
            self.host.store_many(evicted)

    def _path(self, hashes: Sequence[int], n: int) -> list[_Run]:
        """The runs of the resident leading blocks `hashes[:n]`, the last one cut at `n`."""
        runs: list[_Run] = []
        node, pos = self._root, 0
        while pos < n:
            run = node.children[hashes[pos]]
            if pos + run.hi - run.lo > n:
                run = self._split(run, n - pos)
            runs.append(run)
            pos += run.hi - run.lo
            node = run
        return runs

    def _split(self, run: _Run, size: int) -> _Run:
        """Cut `run` after its first `size` blocks; returns the new head (the tail keeps the
        run's place: in the idle order, where an idle head is about to leave it)."""
        head = _Run(run.keys, run.lo, run.lo + size, run.parent, run.refs)
        first = run.keys[run.lo]
        if run.parent is not None:
            run.parent.children[first] = head
        else:
            self._orphans[run.keys[run.lo - 1]][first] = head
        run.lo += size
        head.children[run.keys[run.lo]] = run
        run.parent = head
        return head

    def _detach(self, run: _Run) -> None:
        """Take `run` from the tree where it hangs (its parent, or the evicted block before)."""
        first = run.keys[run.lo]
        if run.parent is not None:
            del run.parent.children[first]
            return
        before = run.keys[run.lo - 1]
        followers = self._orphans[before]
        del followers[first]
        if not followers:
            del self._orphans[before]

    def _add(self, node: _Run, hashes: Sequence[int], pos: int,
             back: list[int]) -> tuple[_Run, int]:
        """Cache the new blocks `hashes[pos:]` after `node`, pinned, up to where they reach a
        resident run that followed an evicted block; every run that followed one of them hangs
        after it again. Returns the last new run and where it ends."""
        orphans = self._orphans
        back = [j for j in back if j >= pos and hashes[j] in orphans]
        end = len(hashes)
        for j in back:
            if j + 1 < end and hashes[j + 1] in orphans[hashes[j]]:
                end = j + 1  # the request goes on into resident blocks
                break
        # With the hash before them, which a run keeps (`keys[lo - 1]`) for when it is evicted;
        # as 64-bit integers, not objects: a resident block costs 8 bytes (tens of millions of
        # one-token pages an instance in an hour of agent sessions).
        lo = 1 if pos else 0
        run = _Run(array("q", hashes[pos - lo:end]), lo, lo + end - pos, node, 1)
        node.children[hashes[pos]] = run
        for j in back:
            if j >= end:
                break
            followers = orphans.pop(hashes[j])
            at = run if j + 1 == end else self._split(run, j + 1 - (pos - lo + run.lo))
            for child in followers.values():
                child.parent = at
            at.children.update(followers)
        return run, end


def _common(run: _Run, hashes: Sequence[int], pos: int) -> int:
    """How many leading blocks of `run` are `hashes[pos:]` (the first one is): a hash stands
    for all blocks before it, so they agree up to a point, found by bisection."""
    keys, lo = run.keys, run.lo
    n = min(run.hi - lo, len(hashes) - pos)
    if keys[lo + n - 1] == hashes[pos + n - 1]:
        return n
    good, bad = 1, n - 1  # keys[lo + good - 1] agrees, keys[lo + bad] does not
    while good < bad:
        mid = (good + bad + 1) // 2
        if keys[lo + mid - 1] == hashes[pos + mid - 1]:
            good = mid
        else:
            bad = mid - 1
    return good
