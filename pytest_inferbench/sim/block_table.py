"""A hash table of 64-bit block hashes, each with its last use, in numpy arrays: tens of
millions of blocks in about 21-32 bytes each, looked up a batch at a time (`RecencySet`'s
many blocks).

Buckets of `WIDTH` slots, a block in the bucket its hash picks, the bucket filled left to
right (blocks are never removed: a full tier evicts from a log of its own, `HostCache`); a
batch is looked up as one gather of its buckets' rows, so a look-up costs one row of memory,
not the twenty-odd probes of a binary search through a sorted array (1.5 us a block at 39
million). A block whose bucket is full waits in a dict (`_overflow`: 2.1 % of 2 M random
hashes at the fullest load). The table grows by half once three quarters of its slots are taken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["BlockTable"]

WIDTH = 16  # slots a bucket: two cache lines of hashes
_FULLEST = 0.75  # the load at which the table grows ...
_AFTER_GROWTH = 0.5  # ... to this load
_EMPTY = np.int64(-(1 << 63))  # an empty slot (a block with this hash waits in the dict)
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # spreads hashes that differ in low bits only


class BlockTable:
    def __init__(self, keys: npt.NDArray[np.int64], last: npt.NDArray[np.int64]) -> None:
        """The table of these distinct blocks and their last uses."""
        self._size = 0
        self._buckets = 0
        self._slots: npt.NDArray[np.int64] = np.empty(0, np.int64)
        self._last: npt.NDArray[np.int64] = np.empty(0, np.int64)
        self._fill: npt.NDArray[np.uint8] = np.empty(0, np.uint8)
        self._overflow: dict[int, int] = {}
        self._rebuild(keys, last, len(keys))

    def __len__(self) -> int:
        return self._size + len(self._overflow)

    def has(self, h: int) -> bool:
        if h in self._overflow:
            return True
        if h == _EMPTY:  # empty slots are not it
            return False
        b = self._bucket_of(np.array([h], np.int64))[0]
        return bool((self._slots[b * WIDTH:(b + 1) * WIDTH] == h).any())

    def contains(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which of `keys` are here."""
        found = self._find(keys)[0]
        if self._overflow:
            found |= np.fromiter(map(self._overflow.__contains__, keys.tolist()), bool, len(keys))
        return found

    def touch(self, keys: npt.NDArray[np.int64], uses: npt.NDArray[np.int64]) -> int:
        """Distinct `keys` used at `uses`: those here get their last use, the others join.
        Returns how many joined."""
        found, at = self._find(keys)
        self._last[at[found]] = uses[found]
        new = ~found
        if self._overflow:  # found in the dict: their last use there
            over = self._overflow
            idx = np.flatnonzero(new)
            waiting = np.fromiter(map(over.__contains__, keys[idx].tolist()), bool, len(idx))
            if waiting.any():
                idx = idx[waiting]
                over.update(zip(keys[idx].tolist(), uses[idx].tolist(), strict=True))
                new[idx] = False
        joining = int(new.sum())
        if joining:
            if self._size + joining > _FULLEST * self._buckets * WIDTH:
                everything, last = self._items()
                self._rebuild(np.concatenate((everything, keys[new])),
                              np.concatenate((last, uses[new])), len(everything) + joining)
            else:
                self._insert(keys[new], uses[new])
        return joining

    def in_order_of_use(self) -> list[int]:
        """Every block, least recently used first."""
        keys, last = self._items()
        return keys[np.argsort(last)].tolist()  # type: ignore[no-any-return]

    def _find(self, keys: npt.NDArray[np.int64]
              ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.intp]]:
        """Which keys are in the slots (not the dict), and where (meaningless where not)."""
        b = self._bucket_of(keys)
        equal = self._slots.reshape(-1, WIDTH)[b] == keys[:, None]
        found: npt.NDArray[np.bool_] = equal.any(axis=1) & (keys != _EMPTY)
        at: npt.NDArray[np.intp] = b * WIDTH + equal.argmax(axis=1)
        return found, at

    def _bucket_of(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
        # The top 32 bits of the product, scaled to the bucket count (no modulo).
        x = (keys.view(np.uint64) * _MULTIPLIER) >> np.uint64(32)
        bucket: npt.NDArray[np.intp] = ((x * np.uint64(self._buckets)) >> np.uint64(32)
                                         ).astype(np.intp)
        return bucket

    def _items(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        taken = self._slots != _EMPTY
        over = self._overflow
        return (np.concatenate((self._slots[taken], np.fromiter(over, np.int64, len(over)))),
                np.concatenate((self._last[taken],
                                np.fromiter(over.values(), np.int64, len(over)))))

    def _rebuild(self, keys: npt.NDArray[np.int64], last: npt.NDArray[np.int64],
                 n: int) -> None:
        self._buckets = max(1, int(n / (_AFTER_GROWTH * WIDTH)) + 1)
        self._slots = np.full(self._buckets * WIDTH, _EMPTY, np.int64)
        self._last = np.zeros(self._buckets * WIDTH, np.int64)
        self._fill = np.zeros(self._buckets, np.uint8)
        self._overflow = {}
        self._size = 0
        self._insert(keys, last)

    def _insert(self, keys: npt.NDArray[np.int64], last: npt.NDArray[np.int64]) -> None:
        """Distinct blocks, none here: each into the next free slot of its bucket (those of
        one bucket one after the other), or the dict when it has none."""
        if not len(keys):
            return
        b = self._bucket_of(keys)
        order = np.argsort(b, kind="stable")
        b, keys, last = b[order], keys[order], last[order]
        starts = np.flatnonzero(np.concatenate(([True], b[1:] != b[:-1])))
        sizes = np.diff(np.append(starts, len(b)))
        rank = np.arange(len(b)) - np.repeat(starts, sizes)
        slot = self._fill[b].astype(np.intp) + rank
        fits = (slot < WIDTH) & (keys != _EMPTY)
        at = b[fits] * WIDTH + slot[fits]
        self._slots[at] = keys[fits]
        self._last[at] = last[fits]
        self._fill[b[starts]] = np.minimum(self._fill[b[starts]].astype(np.intp) + sizes, WIDTH)
        self._size += int(fits.sum())
        if not fits.all():
            self._overflow.update(zip(keys[~fits].tolist(), last[~fits].tolist(), strict=True))
