"""Ending a background asyncio task: the one way the package stops a task it started."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TypeVar

T = TypeVar("T")


async def cancel_and_wait(task: asyncio.Future[T] | None) -> None:
    """Cancel `task` (None: nothing started) and wait until it has ended, so nothing it holds
    outlives the caller. Its cancellation is the expected end; any other error it ended with
    is raised here."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
