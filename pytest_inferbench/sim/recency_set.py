"""A set of block hashes that remembers the order of their last use, compact when large: the
DRAM tier's blocks while it has room and evicts nothing (`host_cache.HostCache`).

A tier of one-token pages (SGLang's page size 1 with HiCache, written through) holds tens of
millions of blocks an instance after an hour of agent sessions: as Python integers in a set and
a log of uses, about 100 bytes a block, 21 GB for one six-instance point. So past
`SETTLE_FROM` blocks they move to a `BlockTable` (numpy arrays, about 32 bytes a block) and each
batch is looked up there at once. Below it, a set and a log of uses (a deque of the hashes as
given), rewritten to each block's latest entry when stale entries outnumber. Most tiers stay
there, and should: the table costs more CPU a batch (a dozen array calls and a random row of
memory a block, against a few hundred set look-ups); a tier of 7.5 M blocks took twice the CPU
in it (qwen3.5 H100 DRAM conc 42, 3600 s: 17.5 s against 9.0).

The order is the uses': a use of `n` blocks is the next `n` positions, a block's last use its
latest position. No clock.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from .block_table import BlockTable

if TYPE_CHECKING:
    from collections.abc import Container, Sequence

__all__ = ["SETTLE_FROM", "RecencySet", "leading_found"]

# Blocks from which they are kept in the table (some 800 MB as Python objects below it).
SETTLE_FROM = 1 << 23


def leading_found(here: Container[int], hashes: Sequence[int]) -> int:
    """How many leading blocks of `hashes` are in `here`, looked up in C (a prompt may be
    one-token pages)."""
    found = list(map(here.__contains__, hashes))
    return found.index(False) if False in found else len(found)


class RecencySet:
    def __init__(self, settle_from: int | None = None) -> None:
        self.settle_from = SETTLE_FROM if settle_from is None else settle_from
        self._recent: set[int] = set()  # the blocks, while few
        self._log: deque[int] = deque()  # their uses, in order
        self._table: BlockTable | None = None  # the blocks once many
        self._uses = 0  # once in the table: uses so far (the next one's position)

    def __len__(self) -> int:
        return len(self._recent) if self._table is None else len(self._table)

    def has(self, h: int) -> bool:
        return h in self._recent if self._table is None else self._table.has(h)

    def leading(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of `hashes` are here."""
        if not hashes or not self.has(hashes[0]):  # the common miss, before a pass over them all
            return 0
        if self._table is None:
            return leading_found(self._recent, hashes)
        missing = np.flatnonzero(~self._table.contains(np.array(hashes, dtype=np.int64)))
        return int(missing[0]) if len(missing) else len(hashes)

    def use(self, hashes: Sequence[int], *, here: bool = False) -> int:
        """These blocks are the most recently used, in this order (the last of a repeated one
        counts); those not here join. Returns how many joined. `here`: all of them are (a
        load): while few, nothing to look up."""
        table = self._table
        if table is not None:
            # Each block once, at its last position in the batch.
            blocks, first_reversed = np.unique(np.array(hashes, dtype=np.int64)[::-1],
                                               return_index=True)
            joined = table.touch(blocks, self._uses + len(hashes) - 1 - first_reversed)
            self._uses += len(hashes)
            return joined
        joined = 0
        if not here:
            before = len(self._recent)
            self._recent.update(hashes)
            joined = len(self._recent) - before
        self._log.extend(hashes)
        if len(self._recent) > self.settle_from:
            self._settle()
        elif len(self._log) > 2 * len(self._recent) + 1024:
            # Each block's latest entry kept, in order (the same order of use, in C).
            latest = list(dict.fromkeys(reversed(self._log)))
            latest.reverse()
            self._log = deque(latest)
        return joined

    def in_order_of_use(self) -> list[int]:
        """Every block, least recently used first."""
        if self._table is not None:
            return self._table.in_order_of_use()
        return list(dict.fromkeys(reversed(self._log)))[::-1]

    def _settle(self) -> None:
        """Many: the blocks move to the table, the log's positions their last uses."""
        log = np.fromiter(self._log, np.int64, len(self._log))
        blocks, first_reversed = np.unique(log[::-1], return_index=True)
        self._table = BlockTable(blocks, len(log) - 1 - first_reversed)
        self._uses = len(log)
        self._recent = set()
        self._log = deque()
