"""Two servers, the same points: does EAGLE3 speculative decoding pay off where it should?

At low concurrency decoding is bound by reading the weights once per step, and a verify step
that accepts ~2.8 tokens (MiniMax-M3's EAGLE3 head) costs little more than a plain step; so the
MTP server must give each user a shorter time per output token than the plain one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_inferbench.plugin.fixtures import PointResult, Server


@pytest.mark.parametrize("conc", [1, 4])
def test_eagle3_lowers_tpot_at_low_concurrency(
        conc: int, inferbench_servers: Callable[..., Server],
        inferbench_load: Callable[..., PointResult]) -> None:
    plain = inferbench_servers("minimaxm3-fp4-mi355x-atom", tp=4)
    mtp = inferbench_servers("minimaxm3-fp4-mi355x-atom-mtp", tp=4)
    base = inferbench_load(isl=1024, osl=256, conc=conc, server=plain)
    spec = inferbench_load(isl=1024, osl=256, conc=conc, server=mtp)
    assert spec["median_tpot"] < base["median_tpot"], (
        f"conc {conc}: median TPOT with EAGLE3 {spec['median_tpot'] * 1e3:.2f} ms, "
        f"without {base['median_tpot'] * 1e3:.2f} ms")
