"""The client's side of a request: reading its body, and stopping the work when it leaves.

A client that disconnects gets its request aborted, streamed or not, at every time scale.
Starlette's own `StreamingResponse` cannot promise that here: its disconnect watcher cancels
the stream through an anyio cancel scope, which passes over a task whose awaited future has
already completed -- and at time scale 0 a stream's next delivery is always already queued
when the scope looks, so the stream ran to its last token for nobody. These helpers cancel the
work's task directly (`Task.cancel` lands at its next step whatever it awaits).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from starlette.requests import ClientDisconnect
from starlette.responses import Response

from ...util.aio import cancel_and_wait
from .openai_api import ApiError

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Coroutine, Mapping

    from starlette.requests import Request
    from starlette.types import Receive, Scope, Send

# A request body that has not fully arrived after this long is refused (a slow or stuck
# client must not hold a connection and its buffers forever).
BODY_TIMEOUT_S = 30.0


async def read_body(request: Request) -> bytes:
    """The whole body; an ApiError when it does not all come (too slow, or the client left
    half way: that answer goes nowhere, and the server log stays quiet about it)."""
    try:
        return await asyncio.wait_for(request.body(), BODY_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise ApiError(408, f"request body not received within {BODY_TIMEOUT_S:g} s") from None
    except ClientDisconnect:
        raise ApiError(400, "the client disconnected before sending the whole body") from None


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone. With the body read, the next ASGI message is the
    disconnect (or the end of the response)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request,
                              work: Coroutine[object, object, dict[str, object] | None]
                              ) -> dict[str, object] | None:
    """The work's result, or None (work cancelled) when the client disconnects first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        await cancel_and_wait(task)
        return None
    return task.result()


class EventStream(Response):
    """A `text/event-stream` response whose events stop the moment the client disconnects:
    the generator is cancelled where it waits, so its `finally` (the engine abort) runs then."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncGenerator[str, None], headers: Mapping[str, str]) -> None:
        self.events = events
        self.status_code = 200
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        pump = asyncio.ensure_future(self._pump(send))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not pump.done():  # the client left, or this handler itself is cancelled
                await cancel_and_wait(pump)
        if not pump.cancelled():
            pump.result()  # an error while streaming goes to the server's handler

    async def _pump(self, send: Send) -> None:
        try:
            async for event in self.events:
                await send({"type": "http.response.body", "body": event.encode(),
                            "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await self.events.aclose()
