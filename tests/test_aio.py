"""`cancel_and_wait`: the task it stops ends; a cancellation of its caller is not swallowed."""

from __future__ import annotations

import asyncio
import sys

import pytest

from pytest_inferbench.util.aio import cancel_and_wait


async def forever() -> None:
    await asyncio.Event().wait()


def test_the_task_is_cancelled_and_awaited() -> None:
    async def scenario() -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(forever())
        await asyncio.sleep(0)
        await cancel_and_wait(task)
        return task

    assert asyncio.run(scenario()).cancelled()


def test_an_error_the_task_ended_with_is_raised() -> None:
    async def fails() -> None:
        raise ValueError("broken")

    async def scenario() -> None:
        task = asyncio.get_running_loop().create_task(fails())
        await asyncio.sleep(0)
        await cancel_and_wait(task)

    with pytest.raises(ValueError, match="broken"):
        asyncio.run(scenario())


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling() is Python 3.11+")
def test_a_cancelled_caller_stays_cancelled() -> None:
    """Ctrl-C under asyncio.run cancels the main task wherever it waits: inside
    cancel_and_wait too. The caller must end cancelled, not carry on."""
    reached_after: list[bool] = []

    async def stubborn() -> None:  # takes a moment to end once cancelled
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.05)

    async def caller() -> None:
        task = asyncio.get_running_loop().create_task(stubborn())
        await asyncio.sleep(0)
        await cancel_and_wait(task)
        reached_after.append(True)

    async def scenario() -> bool:
        outer = asyncio.get_running_loop().create_task(caller())
        await asyncio.sleep(0.01)  # the caller is inside cancel_and_wait, the task ending
        outer.cancel()
        await asyncio.gather(outer, return_exceptions=True)
        return outer.cancelled()

    assert asyncio.run(scenario()) is True
    assert reached_after == []
