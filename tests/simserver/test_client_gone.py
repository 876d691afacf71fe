"""Work for a client that has gone stops: a non-streamed request whose client disconnects is
aborted in the engine, not generated to the end for nobody."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx

from .conftest import ATOM_ARGV, MODEL

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_inferbench.sim.server.launcher import SimServer

REAL_TIME = ("--hardware", "MI355X", "--time-scale", "1")
GIVE_UP_S = 0.5


def test_a_non_streamed_request_is_aborted_when_its_client_goes(
        start_server: Callable[..., SimServer]) -> None:
    server = start_server(ATOM_ARGV, REAL_TIME)
    # 8000 tokens at about 5 ms each: some 40 s of generation in real time.
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 8000, "ignore_eos": True}
    sent = time.monotonic()
    try:
        httpx.post(server.base_url + "/v1/completions", json=body, timeout=GIVE_UP_S)
    except httpx.ReadTimeout:
        pass
    else:
        raise AssertionError("the request finished before the client gave up")

    def record() -> dict[str, object] | None:
        found = httpx.get(server.base_url + "/debug/inferbench/timeline").json()["requests"]
        return found[0] if found and found[0]["outcome"] != "running" else None

    deadline = time.monotonic() + 10
    while (done := record()) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert done is not None, "the request was still running 10 s after its client left"
    assert done["outcome"] == "aborted"
    # Ended soon after the client left (generous for a busy machine), not 40 s later.
    assert float(done["finish"]) - float(done["arrival"]) < 5.0, done  # type: ignore[arg-type]
    assert time.monotonic() - sent < 12
    assert server.process.poll() is None
