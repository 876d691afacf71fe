"""The self-check judges the client's stalls by time, not only by tick percentiles.

A real stall is injected in the client: a blocking sleep in the callback the client runs as each
request completes, on its event loop, during a point against the simulated server in real time.
A long stall is one tick among thousands, so the lag percentiles miss it; the stalled time does
not.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from pytest_inferbench.backends.base import LoadSettings
from pytest_inferbench.backends.http import HttpServerHandle
from pytest_inferbench.loadgen import selfcheck
from pytest_inferbench.loadgen.progress import Progress

if TYPE_CHECKING:
    import types

    from pytest_inferbench.results.measurement import PointMeasurement
    from pytest_inferbench.results.metrics import RequestRecord
    from pytest_inferbench.sim.server.launcher import SimServer


def run_with_stalls(server: SimServer, helpers: types.ModuleType, monkeypatch: pytest.MonkeyPatch,
                    *, osl: int, conc: int, prompts_per_conc: int,
                    stalls_s: tuple[float, ...]) -> PointMeasurement:
    """One point; the first completions of the measured run block the client's loop for
    `stalls_s` (one stall each)."""
    pending = list(stalls_s)
    original = Progress.on_record

    def on_record(self: Progress, record: RequestRecord) -> None:
        original(self, record)
        if pending:
            time.sleep(pending.pop(0))  # the client's own loop, blocked

    monkeypatch.setattr(Progress, "on_record", on_record)
    handle = HttpServerHandle(
        base_url=server.base_url,
        spec=helpers.spec_for((*helpers.ATOM_ARGV, *helpers.EAGLE3), chat_template=False),
        simulated=True)
    point = helpers.server_config("mtp", isl=64, osl=osl, conc=conc).points()[0]
    m = handle.run_point(point, LoadSettings(prompts_per_conc=prompts_per_conc,
                                             warmup_per_conc=1))
    assert not pending and all(r.success for r in m.records)
    return m


def test_stalls_that_take_a_large_share_of_the_point_fail_it(
        eagle_server: SimServer, helpers: types.ModuleType,
        monkeypatch: pytest.MonkeyPatch) -> None:
    m = run_with_stalls(eagle_server, helpers, monkeypatch, osl=256, conc=2, prompts_per_conc=2,
                        stalls_s=(0.5,))
    check = m.client_check
    # One stall is one tick: the percentiles alone would have passed this point.
    assert check["lag_samples"] > 200
    assert check["lag_p99_ms"] < 500
    # The ticker measures from when its wake-up was due, and the stall may begin up to one
    # interval before that: the 0.5 s blocked is at least 0.5 s less one interval of lag.
    assert check["stalled_s"] >= 0.5 - selfcheck.DEFAULT_INTERVAL_S
    assert check["stalled_share"] == pytest.approx(check["stalled_s"] / check["wall_s"])
    assert check["stalled_share"] > selfcheck.MAX_STALLED_SHARE
    assert check["ok"] is False
    assert "event loop stalled for" in str(check["reason"]), check["reason"]


def test_a_stall_longer_than_a_typical_request_fails_the_point(
        eagle_server: SimServer, helpers: types.ModuleType,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Many short requests at conc 1: the one stall is a small share of the point, but longer
    # than the median request, so the requests in flight across it timed the client.
    m = run_with_stalls(eagle_server, helpers, monkeypatch, osl=2, conc=1, prompts_per_conc=120,
                        stalls_s=(0.1,))
    check = m.client_check
    # (On a busy machine the loop's other lags may add up past the share too: both reasons
    # are then given, joined; this one must be among them.)
    limit_ms = check["longest_stall_limit_ms"]
    assert isinstance(limit_ms, float)
    assert 0 < limit_ms < check["lag_max_ms"]
    assert check["ok"] is False
    assert "longest event-loop stall" in str(check["reason"]), check["reason"]
