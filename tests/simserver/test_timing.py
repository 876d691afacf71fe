"""At time scale 1 the server emits on the engine's step timeline (server clock, wall time)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from pytest_inferbench.loadgen.tokenizer import prompt_of_tokens
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.engine import Engine

from .conftest import ATOM_ARGV, MODEL

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_inferbench.sim.server.launcher import SimServer

PROMPT_TOKENS = 1000
OUTPUT_TOKENS = 250  # ~1.5 s of decode at ~6.2 ms per step: 5 % is ~75 ms of slack


def predicted_decode_steps(prompt_tokens: int, output_tokens: int) -> list[float]:
    """The engine model's own step durations for a lone request, after its prefill step."""
    config, _ = engine_config_from_argv(ATOM_ARGV, hardware="MI355X")
    engine = Engine(config)
    engine.add_request(0, prompt_tokens, output_tokens)
    durations = []
    while engine.has_work():
        durations.append(engine.step().duration_s)
    return durations[1:]


def test_lone_request_tpot_follows_the_engine_step_time(
        start_server: Callable[..., SimServer]) -> None:
    server = start_server(ATOM_ARGV, ("--hardware", "MI355X", "--time-scale", "1"))
    body = {"model": MODEL, "prompt": prompt_of_tokens(PROMPT_TOKENS), "stream": True,
            "max_tokens": OUTPUT_TOKENS, "ignore_eos": True}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body,
                      timeout=30) as response:
        assert response.status_code == 200
        for _ in response.iter_lines():
            pass
    timeline = httpx.get(server.base_url + "/debug/inferbench/timeline").json()
    (record,) = timeline["requests"]
    lag = timeline["delivery_lag"]
    assert lag["steps"] == timeline["engine_steps"] >= OUTPUT_TOKENS  # one token per step
    assert 0 <= lag["mean_s"] <= lag["max_s"]
    # Every emission was sent at or after the model's time for it, never early.
    assert all(sent >= planned for (sent, _), planned in
               zip(record["emissions"], record["planned"], strict=True))
    times = [t for t, _ in record["emissions"]]
    assert sum(n for _, n in record["emissions"]) == OUTPUT_TOKENS == len(times)
    steps = predicted_decode_steps(PROMPT_TOKENS, OUTPUT_TOKENS)
    predicted_tpot = sum(steps) / len(steps)
    # The server's schedule is the model's: its planned step ends are the engine's durations.
    planned = record["planned"]
    planned_tpot = (planned[-1] - planned[0]) / (OUTPUT_TOKENS - 1)
    assert planned_tpot == pytest.approx(predicted_tpot, rel=0.01)
    # What was sent follows the schedule up to the server's own measured delivery lag (on a busy
    # machine the scheduler delays the first or the last emission; that lag is the server's
    # self-check): a server pacing its steps with drift would exceed it.
    realized_tpot = (times[-1] - times[0]) / (OUTPUT_TOKENS - 1)
    slack = 0.05 * predicted_tpot + lag["max_s"] / (OUTPUT_TOKENS - 1)
    assert abs(realized_tpot - predicted_tpot) <= slack


def test_client_on_the_same_machine_can_place_chunks_on_the_server_clock(
        mtp_server: SimServer) -> None:
    body = {"model": MODEL, "prompt": "a b c", "max_tokens": 40, "ignore_eos": True,
            "stream": True}
    received: list[float] = []
    with httpx.stream("POST", mtp_server.base_url + "/v1/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                stamp = time.perf_counter()
                event = json.loads(line[6:])
                response_id = event["id"]
                if event["choices"]:
                    received.append(stamp)
    timeline = httpx.get(mtp_server.base_url + "/debug/inferbench/timeline").json()
    (record,) = [r for r in timeline["requests"] if r["id"] == response_id]
    offset = timeline["perf_counter_minus_monotonic"]
    sent = [t + offset for t, _ in record["emissions"]]
    assert len(sent) == len(received)
    lags = [r - s for r, s in zip(received, sent, strict=True)]
    assert min(lags) > 0  # causality holds on the shared clock
    # The request reached the server before its first chunk reached the client, seconds ago at
    # most: the same clock, not another epoch.
    assert 0 < received[0] - (record["arrival"] + offset) < 60
