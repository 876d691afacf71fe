"""The simulator says on every response which clock it streams on, and clients believe it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

from pytest_inferbench.backends.readiness import keeps_real_time, says_simulated

from .conftest import ATOM_ARGV

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_inferbench.sim.server.launcher import SimServer


@pytest.mark.parametrize(("scale", "real_time"), [("0", False), ("1", True), ("0.5", True)])
def test_time_scale_header(start_server: Callable[..., SimServer], scale: str,
                           real_time: bool) -> None:
    server = start_server(ATOM_ARGV, ("--hardware", "MI355X", "--time-scale", scale))
    response = httpx.get(server.base_url + "/health", trust_env=False)
    assert response.status_code == 200
    assert says_simulated(response.headers)
    assert keeps_real_time(response.headers) is real_time


def test_real_servers_keep_real_time() -> None:
    assert keeps_real_time(httpx.Headers({"content-type": "application/json"}))
    assert not says_simulated(httpx.Headers({}))
