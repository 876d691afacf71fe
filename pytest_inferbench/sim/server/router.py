"""`python -m pytest_inferbench.sim route --port P --workers HOST:PORT,...`: a router.

A small round-robin HTTP proxy in front of several OpenAI-compatible servers, so a server made
of several processes (launch spec `roles:`, slurm backend) has one endpoint. It is a plain
load balancer, not a disaggregated prefill/decode router: each request goes whole to the next
worker, its response streamed back byte for byte with the worker's headers (so simulated
workers stay marked simulated). `/health` answers 200 only when every worker does;
`/metrics` is the workers' expositions one after another, so counters add up across them.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
from typing import TYPE_CHECKING

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from starlette.requests import Request

PROG = "python -m pytest_inferbench.sim route"
# Headers that describe one hop's connection, not the message (RFC 9110 7.6.1).
HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer",
                         "upgrade", "proxy-authorization", "proxy-authenticate", "host",
                         "content-length"})
HEALTH_TIMEOUT_S = 2.0


def _end_to_end(headers: httpx.Headers | Sequence[tuple[str, str]]) -> dict[str, str]:
    items = headers.multi_items() if isinstance(headers, httpx.Headers) else headers
    return {k: v for k, v in items if k.lower() not in HOP_HEADERS}


class Router:
    def __init__(self, workers: Sequence[str]) -> None:
        if not workers:
            raise ValueError("a router needs at least one worker")
        self.workers = [w if "://" in w else f"http://{w}" for w in workers]
        self._next = itertools.cycle(self.workers)
        # No read timeout: a long generation streams for as long as the worker takes.
        self.client = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(
            None, connect=10.0), limits=httpx.Limits(max_connections=None,
                                                     max_keepalive_connections=None))

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/{path:path}", self.forward, methods=["GET", "POST", "DELETE"]),
        ], lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        yield
        await self.client.aclose()

    async def _ask_every_worker(self, path: str,
                                failure_status: int) -> list[httpx.Response] | Response:
        """GET `path` from each worker in turn; the first worker that fails decides the answer."""
        answers = []
        for worker in self.workers:
            try:
                answer = await self.client.get(f"{worker}{path}", timeout=HEALTH_TIMEOUT_S)
            except httpx.HTTPError as exc:
                return PlainTextResponse(f"worker {worker}: {type(exc).__name__}", failure_status)
            if answer.status_code != 200:
                return PlainTextResponse(f"worker {worker}: HTTP {answer.status_code}",
                                         failure_status)
            answers.append(answer)
        return answers

    async def health(self, request: Request) -> Response:
        answers = await self._ask_every_worker("/health", 503)
        if isinstance(answers, Response):
            return answers
        return Response(b"", 200, headers=_end_to_end(answers[-1].headers))

    async def metrics(self, request: Request) -> Response:
        answers = await self._ask_every_worker("/metrics", 502)
        if isinstance(answers, Response):
            return answers
        return Response("".join(a.text for a in answers), 200,
                        headers=_end_to_end(answers[-1].headers))

    async def forward(self, request: Request) -> Response:
        worker = next(self._next)
        outgoing = self.client.build_request(
            request.method, f"{worker}{request.url.path}", params=request.query_params,
            headers=_end_to_end(request.headers.items()), content=await request.body())
        try:
            answer = await self.client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            return PlainTextResponse(f"worker {worker}: {type(exc).__name__}: {exc}", 502)
        return StreamingResponse(answer.aiter_raw(), status_code=answer.status_code,
                                 headers=_end_to_end(answer.headers),
                                 background=BackgroundTask(answer.aclose))


def route(argv: Sequence[str]) -> int:
    import uvicorn

    from .cli import START_FAILED_EXIT, EventStack, StartError, bind, port_number

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[1])
    parser.add_argument("--workers", required=True, help="comma-separated HOST:PORT list")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=port_number, required=True, help="port to bind")
    options = parser.parse_args(list(argv))
    workers = [w.strip() for w in options.workers.split(",") if w.strip()]
    if not workers:
        parser.error("--workers: no worker given")
    try:
        sock = bind(options.host, options.port)
    except StartError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return START_FAILED_EXIT
    print(f"inferbench-router: round robin over {', '.join(workers)}, listening on "
          f"http://{options.host}:{sock.getsockname()[1]}", flush=True)
    stack = EventStack.best_available()
    server = uvicorn.Server(uvicorn.Config(
        Router(workers).app(), log_level="warning", access_log=False,
        timeout_graceful_shutdown=2, loop=stack.loop, http=stack.http))
    server.run(sockets=[sock])
    return 0
