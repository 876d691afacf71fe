"""An httpx transport for one load slot: one keep-alive HTTP/1.1 connection, stamped reads.

httpx's default stack (httpcore pool over anyio streams) yields to the event loop on every lock,
write and read. At concurrency 256 a closed-loop worker needed ~100 ms from deciding to send
a request to having it on the wire, and a chunk waited behind every other stream's processing
before its task could stamp it. This transport keeps httpx's client API (requests, timeouts,
exceptions, streaming responses) and replaces what is under it:

- an asyncio `Protocol` stamps every socket read with `time.perf_counter()` in the loop's own
  read callback, before any task runs (`arrival_of(response)` gives the stamp of the bytes the
  latest `aiter_raw()` item came from);
- h11 (httpcore's own HTTP/1.1 parser) turns the request into bytes written in one call, without
  yielding unless the socket buffer is full (`written_at(response)` is that moment);
- one connection, one request at a time: a slot never needs a pool.

Plain HTTP only; `https` URLs keep httpx's default transport (stamps taken on iteration).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import time
from typing import TYPE_CHECKING

import h11
import httpx

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)  # Linux only
_LAST_CHUNK = b"0\r\n\r\n"
# A streamed body is read in batches at least this often (progress, trailers, memory).
BATCH_PERIOD_S = 0.05


class _StampingProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.sock: socket.socket | None = None
        self.chunks: collections.deque[tuple[float, bytes]] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None  # the reader, when it waits for bytes
        self.wake_on_every_read = True
        self.last_data = 0.0
        self.writable = asyncio.Event()
        self.writable.set()
        self.eof = False
        self.error: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.sock = transport.get_extra_info("socket")
        self._quickack()

    def _quickack(self) -> None:
        # ACK every read at once. A server with Nagle's algorithm on (a listening socket
        # created without IPPROTO_TCP gets no TCP_NODELAY from asyncio) holds each small SSE
        # chunk until the previous one is acknowledged; with the client's delayed ACKs that
        # added a variable 1-40 ms to chunk arrivals. Linux resets the flag, so it is renewed
        # on every read.
        if _QUICKACK is not None and self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.last_data = now = time.perf_counter()
        self.chunks.append((now, data))
        # While a streamed body arrives, the reader is only woken for its last chunk (the
        # chunked-encoding terminator); the rest it picks up in batches.
        if self.wake_on_every_read or data.endswith(_LAST_CHUNK):
            self.wake()
        self._quickack()

    def eof_received(self) -> bool:
        self.eof = True
        self.wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self.wake()
        self.writable.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()


def _timeout(request: httpx.Request, kind: str) -> float | None:
    value = (request.extensions.get("timeout") or {}).get(kind)
    return float(value) if value is not None else None


class SlotTransport(httpx.AsyncBaseTransport):
    """One keep-alive connection to the server, used by one request at a time."""

    def __init__(self) -> None:
        self._protocol: _StampingProtocol | None = None
        self._h11: h11.Connection | None = None
        self._busy = False
        self.last_write = 0.0  # when the current request's bytes were handed to the socket
        self.last_arrival = 0.0  # when the bytes of the latest body item reached the loop

    # -- connection ---------------------------------------------------------------------------

    def _reusable(self) -> bool:
        p, conn = self._protocol, self._h11
        return (p is not None and conn is not None and not p.eof and not p.chunks
                and p.transport is not None and not p.transport.is_closing()
                and conn.our_state is h11.IDLE and conn.their_state is h11.IDLE)

    def _drop(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        self._protocol, self._h11 = None, None

    async def _connect(self, request: httpx.Request) -> None:
        self._drop()
        url = request.url
        port = url.port or 80
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(_StampingProtocol, url.host, port),
                _timeout(request, "connect"))
        except asyncio.TimeoutError:
            raise httpx.ConnectTimeout(f"connect to {url.host}:{port} timed out",
                                       request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(f"{url.host}:{port}: {exc.strerror or exc}",
                                     request=request) from exc
        self._protocol, self._h11 = protocol, h11.Connection(h11.CLIENT)

    # -- I/O ------------------------------------------------------------------------------------

    async def _wait(self, p: _StampingProtocol, timeout: float | None) -> bool:
        """Wait for the protocol to wake the reader; False when `timeout` passed first."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        p.waiter = waiter
        expired: list[bool] = []

        def expire() -> None:
            expired.append(True)
            waiter.cancel()

        timer = loop.call_later(timeout, expire) if timeout is not None else None
        try:
            await waiter
            return True
        except asyncio.CancelledError:
            task = asyncio.current_task()
            cancelling = getattr(task, "cancelling", None)  # Python >= 3.11
            if expired and not (cancelling is not None and cancelling()):
                return False
            raise
        finally:
            p.waiter = None
            if timer is not None:
                timer.cancel()

    async def _read(self, request: httpx.Request, batched: bool = False) -> bytes:
        """The next read, with its arrival stamp in `last_arrival`.

        `batched`: the reader is not woken for every read of a streamed body, only for its
        last chunk, the end of the connection, or every `BATCH_PERIOD_S`; the loop then spends
        its time stamping arrivals, not running readers, while the stream is timed.
        """
        p = self._protocol
        assert p is not None
        p.wake_on_every_read = not batched
        read_timeout = _timeout(request, "read")
        started = time.perf_counter()
        while not p.chunks and not p.eof:
            period = BATCH_PERIOD_S if batched else read_timeout
            if period is None or (read_timeout is not None and read_timeout < period):
                period = read_timeout
            if await self._wait(p, period) or p.chunks or p.eof:
                continue
            quiet = time.perf_counter() - max(p.last_data, started)
            if read_timeout is not None and quiet >= read_timeout:
                raise httpx.ReadTimeout(f"no data for {read_timeout} s", request=request)
        if not p.chunks:
            if p.error is not None:
                raise httpx.ReadError(str(p.error), request=request)
            return b""
        arrived, data = p.chunks.popleft()  # one arrival per read: each keeps its own stamp
        self.last_arrival = arrived
        return data

    async def _next_event(self, request: httpx.Request, batched: bool = False
                          ) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        conn = self._h11
        assert conn is not None
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc), request=request) from exc
            if event is not h11.NEED_DATA:
                return event
            conn.receive_data(await self._read(request, batched))

    async def _write(self, request: httpx.Request, data: bytes) -> None:
        p = self._protocol
        assert p is not None and p.transport is not None
        p.transport.write(data)
        self.last_write = time.perf_counter()
        if not p.writable.is_set():
            timeout = _timeout(request, "write")
            try:
                await asyncio.wait_for(p.writable.wait(), timeout)
            except asyncio.TimeoutError:
                raise httpx.WriteTimeout(f"could not write for {timeout} s",
                                         request=request) from None

    # -- httpx ----------------------------------------------------------------------------------

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._busy:
            raise RuntimeError("a load slot serves one request at a time")
        self._busy = True
        try:
            if not self._reusable():
                await self._connect(request)
            conn = self._h11
            assert conn is not None
            body = await request.aread()
            target = request.url.raw_path
            data = conn.send(h11.Request(method=request.method, target=target,
                                         headers=list(request.headers.raw))) or b""
            if body:
                data += conn.send(h11.Data(data=body)) or b""
            data += conn.send(h11.EndOfMessage()) or b""
            await self._write(request, data)
            while True:
                event = await self._next_event(request)
                if isinstance(event, h11.Response):
                    break
                if isinstance(event, h11.ConnectionClosed):
                    raise httpx.RemoteProtocolError("server closed the connection before "
                                                    "answering", request=request)
        except BaseException:
            self._busy = False
            self._drop()
            raise
        chunked = any(name.lower() == b"transfer-encoding" and b"chunked" in value.lower()
                      for name, value in event.headers)
        return httpx.Response(
            status_code=event.status_code, headers=list(event.headers),
            stream=_SlotBody(self, request, batched=chunked),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": bytes(event.reason),
                        "network_stream": self})

    async def _finish(self, completed: bool) -> None:
        conn = self._h11
        self._busy = False
        if (completed and conn is not None and conn.our_state is h11.DONE
                and conn.their_state is h11.DONE):
            conn.start_next_cycle()
        else:
            self._drop()

    async def aclose(self) -> None:
        self._drop()


class _SlotBody(httpx.AsyncByteStream):
    def __init__(self, transport: SlotTransport, request: httpx.Request, batched: bool) -> None:
        self._transport = transport
        self._request = request
        self._batched = batched  # only a chunked body has an end marker to wake on
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            while True:
                event = await self._transport._next_event(self._request, self._batched)
                if isinstance(event, h11.Data):
                    yield bytes(event.data)
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    self._done = isinstance(event, h11.EndOfMessage)
                    return
        except BaseException:
            self._done = False
            raise

    async def aclose(self) -> None:
        await self._transport._finish(self._done)


def written_at(response: httpx.Response) -> float | None:
    """When the request's bytes went to the socket, if this transport sent it."""
    stream = response.extensions.get("network_stream")
    return stream.last_write if isinstance(stream, SlotTransport) and stream.last_write else None


def arrival_of(response: httpx.Response) -> float | None:
    """When the bytes of the latest `aiter_raw()` item reached the event loop, if known."""
    stream = response.extensions.get("network_stream")
    return stream.last_arrival if isinstance(stream, SlotTransport) else None
