"""The benchmarks' process pool: each item's result as it ends, and a process that dies (as the
kernel kills one for memory) reported with its cause while the other items run on."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

# benchmarks/ is no package: its scripts import node_pool from their own folder, as here.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from node_pool import run_each


def square_or_die(n: int) -> int:
    if n == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    if n == 3:
        os._exit(3)
    return n * n


def test_results_and_deaths_each_reported_and_the_rest_runs_on() -> None:
    outcomes = {o.item: o for o in run_each(square_or_die, [1, 2, 3, 4, 5], jobs=2)}
    assert sorted(outcomes) == [1, 2, 3, 4, 5]
    assert {n: outcomes[n].result for n in (1, 4, 5)} == {1: 1, 4: 16, 5: 25}
    assert outcomes[2].result is None and "SIGKILL" in outcomes[2].death
    assert "out-of-memory" in outcomes[2].death
    assert outcomes[3].result is None
    assert outcomes[3].death == "its process exited with code 3 without a result"
    assert all(not outcomes[n].death for n in (1, 4, 5))


def test_workers_are_kept_from_item_to_item() -> None:
    """A process per item would pay each item's first-use costs again (imports, caches)."""
    pids = {o.item: o.result for o in run_each(lambda _: os.getpid(), range(8), jobs=2)}
    assert len(pids) == 8 and len(set(pids.values())) <= 2
    assert os.getpid() not in pids.values()
