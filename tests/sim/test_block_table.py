"""The numpy table of many blocks: the same blocks and last uses as a dict, whether a block sits
in its bucket or waits in the dict beside it (a full bucket, or the empty slots' own hash)."""

from __future__ import annotations

import random

import numpy as np

from pytest_inferbench.sim.block_table import WIDTH, BlockTable


def _crowded(rng: random.Random, n: int) -> list[int]:
    """`n` hashes in one half of the multiplier's range: while the table has two buckets, all
    in the first (a full bucket long before the table grows)."""
    out: list[int] = []
    while len(out) < n:
        h = rng.randrange(-(1 << 63), 1 << 63)
        if (h * 0x9E3779B97F4A7C15) & ((1 << 64) - 1) < 1 << 63:
            out.append(h)
    return out


def test_blocks_and_last_uses_are_a_dicts_through_full_buckets_and_growth() -> None:
    rng = random.Random(7)
    first = _crowded(rng, 9)  # two buckets of WIDTH slots
    table = BlockTable(np.array(first, np.int64), np.arange(9, dtype=np.int64))
    ref = dict(zip(first, range(9), strict=True))
    pool = [*first, *_crowded(rng, 3 * WIDTH), -(1 << 63), *(rng.randrange(1 << 40)
                                                           for _ in range(2000))]
    use = 9
    for step in range(300):
        batch = list(dict.fromkeys(rng.sample(pool[:60] if step < 20 else pool, 12)))
        keys = np.array(batch, np.int64)
        assert table.contains(keys).tolist() == [h in ref for h in batch]
        joined = table.touch(keys, np.arange(use, use + len(batch), dtype=np.int64))
        assert joined == sum(h not in ref for h in batch)
        ref.update(zip(batch, range(use, use + len(batch)), strict=True))
        use += len(batch)
        assert len(table) == len(ref)
    assert table._overflow  # a full bucket was reached: the dict was used
    assert [table.has(h) for h in pool] == [h in ref for h in pool]
    assert table.in_order_of_use() == sorted(ref, key=ref.__getitem__)
