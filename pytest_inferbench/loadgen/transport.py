"""An httpcore network backend that timestamps bytes when the event loop receives them.

httpx's default stack (anyio streams) toggles reading per receive and yields to the event loop
after every write. At concurrency 64 a chunk waited behind every other stream's parsing before
its task could stamp it, and a request body waited behind them before it was written. Here:

- `data_received` stamps each socket read with `time.perf_counter()` in the loop's own read
  callback, before any task runs; `StampedStream.last_arrival` is the stamp of the newest bytes
  the last `read()` returned, which the client pairs with each `aiter_raw()` item;
- `write()` hands the bytes to the transport without yielding unless the socket's buffer is
  full, so headers and body leave together.

Plain HTTP only; `https` URLs keep httpx's default transport (stamps taken on iteration).
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import TYPE_CHECKING, Any

import httpcore
import httpx

if TYPE_CHECKING:
    import ssl
    from collections.abc import Iterable


class _StampingProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: collections.deque[tuple[float, bytes]] = collections.deque()
        self.readable = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()
        self.eof = False
        self.error: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.chunks.append((time.perf_counter(), data))
        self.readable.set()

    def eof_received(self) -> bool:
        self.eof = True
        self.readable.set()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self.readable.set()
        self.writable.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()


class StampedStream(httpcore.AsyncNetworkStream):
    def __init__(self, protocol: _StampingProtocol) -> None:
        self._protocol = protocol
        self.last_arrival = 0.0
        self.last_write = 0.0  # when the latest write was handed to the socket

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        p = self._protocol
        if not p.chunks and not p.eof:
            p.readable.clear()
            try:
                await asyncio.wait_for(p.readable.wait(), timeout)
            except asyncio.TimeoutError:
                raise httpcore.ReadTimeout(f"no data for {timeout} s") from None
        if not p.chunks:
            if p.error is not None:
                raise httpcore.ReadError(str(p.error))
            return b""
        # One arrival per read, never merged: each aiter_raw() item keeps its own stamp.
        arrived, data = p.chunks.popleft()
        if len(data) > max_bytes:
            p.chunks.appendleft((arrived, data[max_bytes:]))
            data = data[:max_bytes]
        self.last_arrival = arrived
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        p = self._protocol
        if p.transport is None or p.transport.is_closing():
            raise httpcore.WriteError("connection is closed")
        p.transport.write(buffer)
        self.last_write = time.perf_counter()
        if not p.writable.is_set():
            try:
                await asyncio.wait_for(p.writable.wait(), timeout)
            except asyncio.TimeoutError:
                raise httpcore.WriteTimeout(f"could not write for {timeout} s") from None

    async def aclose(self) -> None:
        if self._protocol.transport is not None:
            self._protocol.transport.close()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("the stamping backend serves plain HTTP only")

    def get_extra_info(self, info: str) -> Any:
        p = self._protocol
        if info == "is_readable":  # an idle keep-alive connection the server closed or wrote to
            return bool(p.chunks) or p.eof
        if p.transport is None:
            return None
        if info in ("socket", "client_addr", "server_addr"):
            key = {"client_addr": "sockname", "server_addr": "peername"}.get(info, info)
            return p.transport.get_extra_info(key)
        return None


class StampingBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> StampedStream:
        loop = asyncio.get_running_loop()
        local = (local_address, 0) if local_address else None
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(_StampingProtocol, host, port, local_addr=local), timeout)
        except asyncio.TimeoutError:
            raise httpcore.ConnectTimeout(f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(f"{host}:{port}: {exc.strerror or exc}") from exc
        return StampedStream(protocol)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def stamping_transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport | None:
    """httpx's own transport over the stamping backend, or None if httpx's layout changed."""
    transport = httpx.AsyncHTTPTransport(limits=limits, trust_env=False)
    if not isinstance(getattr(transport, "_pool", None), httpcore.AsyncConnectionPool):
        return None
    # The pool is httpx's private attribute; the request mapping, exception mapping and response
    # streaming around it stay httpx's own.
    transport._pool = httpcore.AsyncConnectionPool(
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry, http1=True, http2=False,
        network_backend=StampingBackend())
    return transport


def written_at(response: httpx.Response) -> float | None:
    """When the request's last bytes were handed to the socket, if known (call after headers)."""
    stream = response.extensions.get("network_stream")
    return stream.last_write if isinstance(stream, StampedStream) and stream.last_write else None


def arrival_of(response: httpx.Response) -> float | None:
    """When the bytes of the latest `aiter_raw()` item reached the event loop, if known."""
    stream = response.extensions.get("network_stream")
    return stream.last_arrival if isinstance(stream, StampedStream) else None
