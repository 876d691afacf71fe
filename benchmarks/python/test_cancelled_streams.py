"""The server survives clients that go away: 200 streams cancelled after their first chunk,
then a normal load point that must complete every request (its gates fail on any failure).

This talks HTTP to the server, so it needs a backend that serves over HTTP (`sim-server`,
`docker`, `process`, `external`, `slurm`); the in-process `sim` backend has no stream to cancel.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_inferbench.plugin.fixtures import PointResult, Server

CANCELLED = 200
AT_ONCE = 20


def open_and_cancel(server: Server, index: int) -> bool:
    """Start a long stream, read its first chunk, then close the connection."""
    assert server.spec is not None and server.base_url is not None
    body = {"model": server.spec.served_model, "prompt": f"story number {index}: once upon",
            "max_tokens": 4096, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=server.base_url, timeout=60.0) as client, \
            client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            return False
        return next(response.iter_lines(), None) is not None


@pytest.mark.inferbench_server("minimaxm3-fp4-mi355x-atom", tp=4)
def test_server_survives_cancelled_streams(inferbench_server: Server,
                                           inferbench_load: Callable[..., PointResult]) -> None:
    if inferbench_server.base_url is None:
        pytest.skip("needs a server over HTTP (--inferbench-backend sim-server or a real one)")
    with ThreadPoolExecutor(AT_ONCE) as pool:
        started = list(pool.map(lambda i: open_and_cancel(inferbench_server, i),
                                range(CANCELLED)))
    assert all(started), f"{started.count(False)} of {CANCELLED} streams did not start"
    after = inferbench_load(isl=1024, osl=128, conc=8)
    assert after["completed"] == after["num_prompts"]
    health = httpx.get(inferbench_server.base_url + "/health", timeout=10.0)
    assert health.status_code == 200
