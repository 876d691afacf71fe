"""The engine loop's timeline when the machine falls behind it (the test supplies the clock)."""

from __future__ import annotations

import asyncio
import time

import pytest

from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.engine import Engine
from pytest_inferbench.sim.server import engine_loop
from pytest_inferbench.sim.server.engine_loop import Delivery, EngineLoop

from .conftest import ATOM_ARGV


class StallingClock:
    """Real time plus a jump: `stall(s)` makes the machine lose `s` seconds at once, as a
    descheduled process does."""

    def __init__(self) -> None:
        self.lost = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.lost

    def stall(self, seconds: float) -> None:
        self.lost += seconds


async def first_delivery(queue: asyncio.Queue[Delivery]) -> Delivery:
    return await asyncio.wait_for(queue.get(), timeout=30)


def test_a_request_arriving_after_a_stall_gets_no_token_planned_before_its_arrival() -> None:
    config, _ = engine_config_from_argv(list(ATOM_ARGV), hardware="MI355X")
    clock = StallingClock()

    async def scenario() -> tuple[float, float]:
        loop = EngineLoop(Engine(config), time_scale=1.0, clock=clock)
        loop.start()
        try:
            _, running = loop.submit(1000, 400)  # keeps the engine stepping
            await first_delivery(running)
            clock.stall(0.5)  # the loop's planned step ends are now half a second past
            arrival = clock()
            _, queue = loop.submit(100, 4)
            delivery = await first_delivery(queue)
            return arrival, delivery.step_end
        finally:
            await loop.stop()

    arrival, first_token_planned = asyncio.run(scenario())
    assert first_token_planned > arrival



def test_the_model_clock_counts_steps_and_waits_for_work_not_a_late_machine() -> None:
    """The clock the server's simulated energy covers (`sim/server/energy.py`)."""
    config, _ = engine_config_from_argv(list(ATOM_ARGV), hardware="MI355X")
    clock = StallingClock()
    stall_s = 5.0  # far beyond any real delay of this test

    async def scenario() -> tuple[float, float, float]:
        loop = EngineLoop(Engine(config), time_scale=1.0, clock=clock)
        loop.start()
        try:
            _, queue = loop.submit(1000, 40)
            await first_delivery(queue)
            clock.stall(stall_s)  # the machine falls behind while the engine has work
            while not (await first_delivery(queue)).finished:
                pass
            served = loop.model_seconds()
            clock.stall(stall_s)  # the same while it waits for work
            return served, loop.busy_s, loop.model_seconds()
        finally:
            await loop.stop()

    served, busy_s, waited = asyncio.run(scenario())
    assert busy_s > 0
    assert served - busy_s < stall_s / 2  # the late steps' lag is the machine's, not idle time
    assert waited - served >= stall_s  # a wait for work is the model's idle time


BURST_CONC = 64
WRITE_S = 0.00015  # one stream write's CPU, about what a chunk costs the served simulator
# Model steps three times as long as real ones: the burst (9.6 ms) stays, and a machine busy
# with other work still finishes each step's deliveries long before the next is due, so the
# lateness measured is the timer's, not a backlog.
TIME_SCALE = 3.0


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def mean_step_lateness() -> float:
    """Mean lateness of step ends when every delivery costs WRITE_S of loop time (uvloop)."""
    config, _ = engine_config_from_argv(list(ATOM_ARGV), hardware="MI355X")

    async def consume(queue: asyncio.Queue[Delivery]) -> None:
        while not (await queue.get()).finished:
            busy(WRITE_S)

    async def scenario() -> float:
        loop = EngineLoop(Engine(config), time_scale=TIME_SCALE)
        loop.start()
        try:
            queues = [loop.submit(100, 90)[1] for _ in range(BURST_CONC)]
            await asyncio.gather(*(consume(q) for q in queues))
        finally:
            await loop.stop()
        return float(loop.lag.as_json()["mean_s"])

    import uvloop

    return uvloop.run(scenario())


def test_step_timers_are_armed_after_the_steps_deliveries_are_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """libuv's poll timeout counts from the loop time cached when an iteration began: a timer
    armed ahead of a step's burst of stream writes fires late by the whole burst, every step.
    The loop arms it after the burst (`_settle`); without that, steps end a burst late."""
    pytest.importorskip("uvloop")  # a base dependency except on Windows
    burst_s = BURST_CONC * WRITE_S
    settled = mean_step_lateness()
    async def arm_at_once() -> None:  # what the loop did before
        return None

    monkeypatch.setattr(engine_loop, "_settle", arm_at_once)
    unsettled = mean_step_lateness()
    print(f"\nmean step lateness with a {burst_s * 1e3:.1f} ms burst per step: "
          f"{settled * 1e3:.2f} ms settled, {unsettled * 1e3:.2f} ms timer armed before it")
    assert unsettled > 0.5 * burst_s  # the mechanism this guards against is real here
    assert settled < unsettled - 0.5 * burst_s
