"""Ending a background asyncio task: the one way the package stops a task it started."""

from __future__ import annotations

import asyncio
from typing import TypeVar

T = TypeVar("T")


async def cancel_and_wait(task: asyncio.Future[T] | None) -> None:
    """Cancel `task` (None: nothing started) and wait until it has ended, so nothing it holds
    outlives the caller. Its cancellation is the expected end; any other error it ended with
    is raised here. A cancellation of the caller itself (Ctrl-C under `asyncio.run` cancels the
    main task) goes on up: swallowing it would let a run carry on after it was interrupted."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        caller = asyncio.current_task()
        cancelling = getattr(caller, "cancelling", None)  # Python >= 3.11
        if cancelling is not None and cancelling():
            raise
