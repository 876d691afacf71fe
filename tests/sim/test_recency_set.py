"""The DRAM tier's blocks while it has room: the same blocks and order of use as a list would
keep, whether few (a set and a log) or many (a numpy table), and the table about 32 bytes a
block."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from pytest_inferbench.sim import recency_set
from pytest_inferbench.sim.host_cache import HostCache
from pytest_inferbench.sim.recency_set import RecencySet


class _InOrder:
    """The rules one block at a time: a list, least recently used first."""

    def __init__(self) -> None:
        self.order: list[int] = []

    def use(self, hashes: list[int]) -> int:
        joined = 0
        for h in hashes:
            if h in self.order:
                self.order.remove(h)
            else:
                joined += 1
            self.order.append(h)
        return joined

    def leading(self, hashes: list[int]) -> int:
        n = 0
        while n < len(hashes) and hashes[n] in self.order:
            n += 1
        return n


@pytest.mark.parametrize("settle_from", [4, 40, 1 << 20])
def test_blocks_and_their_order_of_use_are_a_lists(settle_from: int) -> None:
    # Batches written (new, here already, repeated, both) and loaded; 4 and 40: the blocks
    # move to the table early, and it grows as more join; 1 << 20: they never do.
    rng = random.Random(settle_from)
    blocks = [rng.randrange(-(1 << 63), 1 << 63) for _ in range(300)]
    here, ref = RecencySet(settle_from), _InOrder()
    for _ in range(4000):
        if ref.order and rng.random() < 0.3:
            batch = rng.sample(ref.order, min(len(ref.order), rng.randrange(1, 8)))
            assert here.use(batch, here=True) == 0
            ref.use(batch)
            continue
        batch = [rng.choice(blocks) for _ in range(rng.randrange(1, 12))]
        assert here.leading(batch) == ref.leading(batch)
        assert here.use(batch) == ref.use(batch)
        assert len(here) == len(ref.order)
    assert [here.has(h) for h in blocks] == [h in ref.order for h in blocks]
    assert here.in_order_of_use() == ref.order


def test_many_blocks_are_kept_in_about_32_bytes_each_not_as_objects() -> None:
    # A prompt of one-token pages written through, a million blocks past where they settle,
    # then its first half loaded back: what the set keeps, measured.
    prompt = list(range(3 << 20, 4 << 20))
    tracemalloc.start()
    try:
        here = RecencySet(settle_from=1 << 16)
        here.use(prompt)
        here.use(prompt[: 1 << 19], here=True)
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(here) == len(prompt)
    # 16 bytes a slot (hash, last use), half the slots taken after the table grew, a fill
    # count a bucket: a Python integer alone is 32 bytes, in a set about 90.
    assert kept <= 33 * len(prompt)
    assert here.leading(prompt) == len(prompt)
    assert here.leading([-1, *prompt]) == 0
    assert here.in_order_of_use() == prompt[1 << 19:] + prompt[: 1 << 19]


def test_a_dram_tier_of_many_blocks_fills_and_evicts_in_their_order_of_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # In the table while it had room, then full: the least recently used go first.
    monkeypatch.setattr(recency_set, "SETTLE_FROM", 8)
    host = HostCache(capacity_blocks=100)
    host.store_many(list(range(60)))
    host.load(list(range(10)))  # used again: now the most recent
    host.store_many(list(range(60, 100)))
    assert (host.used_blocks, host.written_blocks, host.evictions) == (100, 100, 0)
    host.store_many(list(range(100, 115)))
    assert host.evictions == 15
    assert [h for h in range(115) if not host.match([h])] == list(range(10, 25))
