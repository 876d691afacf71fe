"""The client's connections to the server: a keep-alive pool with the client's headers and
TLS verification, or one single-connection client per concurrent request (`connection_slots`),
each stamping its reads (`transport.SlotTransport`). No proxies from the environment: the
numbers are the server's, not a proxy's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import TYPE_CHECKING

import httpx

from .transport import SlotTransport

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .client import ClientConfig


def tls_verification(cfg: ClientConfig) -> ssl.SSLContext | bool:
    """A verifying TLS context for https servers; nothing to verify on plain http."""
    return ssl.create_default_context() if cfg.tls else False


def make_http_client(cfg: ClientConfig, connections: int | None = None,
                     verify: ssl.SSLContext | bool | None = None) -> httpx.AsyncClient:
    """A keep-alive pool of `connections` (default: the concurrency), no proxies."""
    size = connections or cfg.concurrency
    limits = httpx.Limits(max_connections=size, max_keepalive_connections=size,
                          keepalive_expiry=60.0)
    # Raw SSE bytes are parsed as they came: no compressed streams.
    headers = {"Accept-Encoding": "identity"}
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    if verify is None:
        verify = tls_verification(cfg)
    # A slot (one connection) gets the stamping transport; larger pools and https stay httpx's.
    transport = SlotTransport() if size == 1 and not cfg.tls else None
    return httpx.AsyncClient(base_url=cfg.base_url, limits=limits, timeout=cfg.timeouts.httpx(),
                             trust_env=False, headers=headers, verify=verify,
                             transport=transport)


@contextlib.asynccontextmanager
async def connection_slots(cfg: ClientConfig) -> AsyncIterator[list[httpx.AsyncClient]]:
    """One single-connection client per concurrent request (`transport.SlotTransport`).

    httpcore's pool rescans every connection for every queued request (quadratic); at
    concurrency 64 a shared pool blocked the event loop for ~100 ms per burst. A connection
    per slot is the same number of keep-alive connections at constant cost.
    """
    verify = tls_verification(cfg)  # one context shared by every slot
    clients = [make_http_client(cfg, 1, verify) for _ in range(cfg.concurrency)]
    try:
        yield clients
    finally:
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)
