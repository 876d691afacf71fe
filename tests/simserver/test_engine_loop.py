"""The engine loop's timeline when the machine falls behind it (the test supplies the clock)."""

from __future__ import annotations

import asyncio
import time

from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.engine import Engine
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
