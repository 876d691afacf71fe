"""The server pool on its own: one start per server identity, stops when nobody wants it, a
failed start answered to every user without a second start."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from pytest_inferbench.plugin.server_pool import ServerPool, server_key
from pytest_inferbench.recipe.launch import LaunchSpecError
from pytest_inferbench.recipe.schema import load_recipe
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    path = tmp_path / "bench-master.yaml"
    path.write_text(master_entry(rows=["{ tp: 4, conc-list: [1] }", "{ tp: 8, conc-list: [1] }"],
                                 isl=64, osl=8))
    (tmp_path / "launch").mkdir()
    shutil.copy(REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml", tmp_path / "launch")
    return path


def test_same_identity_shares_a_start_until_nobody_wants_it(
        pytestconfig: pytest.Config, recipe: Path) -> None:
    tp4, tp8 = load_recipe(recipe).servers
    # The same server seen from another recipe line (other points): the same identity.
    again = dataclasses.replace(tp4, line=99, sweeps=tp4.sweeps[:0])
    pool = ServerPool(pytestconfig)
    first = pool.acquire(tp4)
    second = pool.acquire(again)
    assert second is first and pool.starts == 1 and first.holders == 2
    other = pool.acquire(tp8)
    assert other is not first and pool.starts == 2
    pool.release(first)
    pool.release(second)
    pool.settle([server_key(pytestconfig, tp4)])  # the next item wants it: kept
    assert pool.acquire(tp4) is first and pool.starts == 2
    pool.release(first)
    pool.settle([])  # idle and unwanted: stopped; tp8 is still held
    assert first.handle is None and other.handle is not None
    assert pool.acquire(tp4) is not first and pool.starts == 3
    assert pool.close() == [] and other.handle is None


def test_a_failed_start_is_answered_to_every_user_without_a_second_start(
        pytestconfig: pytest.Config, recipe: Path) -> None:
    # A config neither the launch directory nor the package has a launch spec for.
    recipe.write_text(master_entry(runner="mi300x", isl=64, osl=8))
    (server,) = load_recipe(recipe).servers
    pool = ServerPool(pytestconfig)
    with pytest.raises(LaunchSpecError) as first:
        pool.acquire(server)
    with pytest.raises(LaunchSpecError) as second:
        pool.acquire(server)
    assert second.value is first.value and pool.starts == 1
    pool.settle([])  # forgotten once nobody wants it: the next user tries again
    with pytest.raises(LaunchSpecError):
        pool.acquire(server)
    assert pool.starts == 2
