"""The simulator as an OpenAI-compatible HTTP server (starlette ASGI app, served by uvicorn).

Routes: `/health`, `/v1/models`, `/v1/completions`, `/v1/chat/completions` (SSE streaming and
plain JSON), `/metrics` (persona names), `/debug/mtp_stats` (ATOM), and
`/debug/inferbench/timeline` + `/debug/inferbench/info` (server-side truth for tests). Every
response carries `x-inferbench-simulated: true`; every error is an OpenAI-style JSON body
(`{"error": {"message", "type", "param", "code"}}`), never a traceback.
Streaming and token timing live in `sim/streaming.py`; this module is routing and policy.

`GET /debug/inferbench/timeline[?since=REQUEST_ID]` (`DELETE` clears it) returns
`{"clock": "time.monotonic", "now", "wall_minus_monotonic", "perf_counter_minus_monotonic",
"time_scale", "engine_steps", "delivery_lag", "retention", "requests": [...]}`
(`delivery_lag`: how far step deliveries fell behind the model's step ends on this machine:
steps, mean_s, max_s, steps_over_5ms; `retention`: the records kept, their estimated bytes,
the byte budget (`--timeline-mib`) and record limit, and how many older records were dropped
to stay within them, see `timeline.py`); each finished (or aborted, truncated, stalled)
request has `id` (the response id the client saw), `request_id`, `arrival`,
`prompt_tokens`, `max_tokens`, `emissions` ([send time, tokens] per chunk), `planned` (the
engine model's time for each emission), `completion_tokens`, `finish`, `outcome` and
`submitted` (when the engine got it, its body read and parsed). Times are
on the server's `time.monotonic()`, the system-wide CLOCK_MONOTONIC on Linux, so a client on
the same machine compares its own `time.monotonic()` stamps directly (or adds the offsets).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...frameworks import registry as framework_registry  # apart from self.registry (prometheus)
from .connection import EventStream, read_body, unless_disconnected
from .energy import energy_collector
from .engine_loop import EngineLoop
from .faults import FAULT_EXIT_CODE, FaultConfig, FaultInjector
from .openai_api import ApiError, Kind, parse_generation, parse_json_object, resolve_max_tokens
from .output_plan import plan_output
from .prom import exposition, metrics_registry, mtp_stats
from .prom_latency import LatencyHistograms
from .streaming import Generation, collect_response, stream_events
from .timeline import DEFAULT_BUDGET_MIB, MIB, RequestTrace

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping

    from prometheus_client.registry import Collector
    from starlette.requests import Request
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from .engine_loop import EngineLike
    from .oracle import Oracle
    from .prom import MetricsSnapshot

SIMULATED_HEADER = (b"x-inferbench-simulated", b"true")
TIME_SCALE_HEADER = b"x-inferbench-time-scale"
# llm-d-inference-sim's deterministic failure: a request carrying `X-Return-Error: 429` gets a
# 429 (any 4xx/5xx status) with an OpenAI-style body, so a client can test one exact failure.
RETURN_ERROR_HEADER = "x-return-error"


@dataclass(frozen=True)
class ServeConfig:
    persona: str  # a framework registry name: metric names and its debug endpoint
    hardware: str
    time_scale: float  # 1.0 real time; 0 = as fast as possible
    seed: int
    served_models: tuple[str, ...]  # the first is the name reported in metrics
    max_model_len: int
    make_engine: Callable[[], EngineLike]
    snapshot: Callable[[EngineLike], MetricsSnapshot]  # engine counters -> metrics
    faults: FaultConfig = field(default_factory=FaultConfig)
    oracle: Oracle | None = None
    info: Mapping[str, object] | None = None  # facts shown on /debug/inferbench/info
    # More /metrics families read from the engine (a deployment's per-role counters).
    extra_metrics: Callable[[EngineLike, str], Collector] | None = None
    # Memory for /debug/inferbench/timeline's records; the oldest go first beyond it.
    timeline_bytes: int = int(DEFAULT_BUDGET_MIB * MIB)


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


class SimulatedHeader:
    """ASGI middleware: every response says its numbers are simulated, and on what clock.

    A time scale of 0 means tokens stream as fast as the process can send them: clients use
    the header to know that the gaps they measure are not timings.
    """

    def __init__(self, app: ASGIApp, time_scale: float) -> None:
        self.app = app
        self.headers = [SIMULATED_HEADER, (TIME_SCALE_HEADER, repr(time_scale).encode())]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_marked(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.headers]
            await send(message)

        await self.app(scope, receive, send_marked if scope["type"] == "http" else send)


class SimulatorApp:
    """State of one simulated server: engine loop, faults, counters."""

    def __init__(self, config: ServeConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.started_at = clock()
        self.faults = FaultInjector(config.faults, config.seed, self.started_at)
        self.engine = config.make_engine()
        self.loop: EngineLoop | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._arrivals = itertools.count()
        self._crashing = False
        self.latency = LatencyHistograms()
        self.registry = metrics_registry(config.persona, config.served_models[0],
                                         lambda: config.snapshot(self.engine), self.latency)
        if config.extra_metrics is not None:
            self.registry.register(config.extra_metrics(self.engine, config.served_models[0]))
        energy = energy_collector(self.engine, config.served_models[0], lambda: self.loop)
        if energy is not None:
            self.registry.register(energy)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.loop = EngineLoop(self.engine, self.config.time_scale, self.clock,
                               self.config.timeline_bytes)
        self._event_loop = asyncio.get_running_loop()
        self.loop.start()
        try:
            yield
        finally:
            await self.loop.stop()

    def begin_shutdown(self) -> None:
        """Called from the signal handler: end open streams so the shutdown is prompt."""
        if self._event_loop is not None and self.loop is not None:
            self._event_loop.call_soon_threadsafe(self.loop.close_streams)

    def app(self) -> ASGIApp:
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            # Every persona serves the speculative-decoding stats where any entry names them
            # (ATOM's `/debug/mtp_stats`), as it always has.
            *(Route(path, self.mtp_stats, methods=["GET"]) for path in dict.fromkeys(
                f.debug_stats for f in framework_registry.frameworks() if f.debug_stats)),
            Route("/debug/inferbench/timeline", self.timeline, methods=["GET", "DELETE"]),
            Route("/debug/inferbench/info", self.info, methods=["GET"]),
        ]
        app = Starlette(routes=routes, lifespan=self.lifespan, exception_handlers={
            HTTPException: self._http_error, Exception: self._unexpected})
        return SimulatedHeader(app, self.config.time_scale)

    # -- policy -------------------------------------------------------------------------------

    def _ensure_serving(self) -> None:
        now = self.clock()
        if self.loop is not None and self.loop.failure is not None:
            raise ApiError(500, f"simulated engine failed: {self.loop.failure!r}")
        if self.loop is not None and self.loop.closing.is_set():
            raise ApiError(503, "simulated server is shutting down")
        if not self.faults.is_ready(now):
            raise ApiError(503, self.faults.not_ready_reason(now))

    def _check_model(self, model: str) -> None:
        if model not in self.config.served_models:
            raise ApiError(404, f"The model `{model}` does not exist; this server serves "
                                f"{', '.join(self.config.served_models)}.",
                           param="model", code="model_not_found")

    def _request_done(self) -> None:
        if self.faults.request_finished() and not self._crashing:
            self._crashing = True
            # Leave the last response a moment to flush, then die like a crashed engine.
            asyncio.get_running_loop().call_later(0.1, _crash, self.config.faults)

    # -- routes -------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        try:
            self._ensure_serving()
        except ApiError as error:
            status = "error" if error.status == 500 else "loading"
            return JSONResponse({"status": status, "message": error.message},
                                status_code=error.status)
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        try:
            self._ensure_serving()
        except ApiError as error:
            return error_response(error)
        created = int(time.time())
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "inferbench-sim",
             "root": name, "max_model_len": self.config.max_model_len, "simulated": True}
            for name in self.config.served_models]})

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completion")

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def _generate(self, request: Request, kind: Kind) -> Response:
        assert self.loop is not None, "lifespan starts the engine loop before any request"
        arrival = self.clock()
        try:
            self._ensure_serving()
            _header_fault(request.headers.get(RETURN_ERROR_HEADER))
            parsed = parse_generation(kind, parse_json_object(await read_body(request)))
            self._check_model(parsed.model)
            max_tokens = resolve_max_tokens(parsed, self.config.max_model_len)
        except ApiError as error:
            return error_response(error)
        arrival_number = next(self._arrivals)
        plan = plan_output(parsed, max_tokens, self.config.oracle,
                           f"{self.config.seed}:{arrival_number}")
        faults = self.faults.for_request(arrival_number, plan.tokens, parsed.stream)
        if faults.error:
            self._request_done()
            return error_response(ApiError(
                500, "simulated internal server error (fault injection: --error-rate)"))
        try:
            request_id, queue = self.loop.submit(parsed.prompt_tokens, plan.tokens,
                                                 parsed.prompt_text)
        except ValueError as exc:  # the engine refuses what it can never schedule
            return error_response(ApiError(400, str(exc), param="prompt"))
        prefix = "cmpl" if kind == "completion" else "chatcmpl"
        trace = RequestTrace(request_id, f"{prefix}-{uuid.uuid4().hex}", arrival,
                             parsed.prompt_tokens, plan.tokens, submitted=self.clock())
        generation = Generation(parsed, plan, faults, trace, queue, int(time.time()))
        if not parsed.stream:
            try:
                body = await unless_disconnected(request, collect_response(generation,
                                                                           self.loop))
            finally:
                self._finish(generation)  # a client that left: aborted, its work stops
            if body is None:
                if self.loop.failure is None:
                    return error_response(ApiError(503, "simulated server is shutting down"))
                return error_response(ApiError(500, f"simulated engine failed: "
                                                    f"{self.loop.failure!r}"))
            return JSONResponse(body, headers={"x-request-id": trace.response_id})
        return EventStream(self._stream(generation), headers={
            "cache-control": "no-cache", "x-request-id": trace.response_id})

    async def _stream(self, generation: Generation) -> AsyncGenerator[str, None]:
        assert self.loop is not None
        try:
            async for event in stream_events(generation, self.loop):
                yield event
        finally:
            self._finish(generation)

    def _finish(self, generation: Generation) -> None:
        assert self.loop is not None
        trace = generation.trace
        if trace.outcome == "running":
            trace.outcome = "aborted"  # the client went away or the task was cancelled
        if trace.finish is None:
            trace.finish = self.clock()
        self.loop.abort(trace.request_id)
        self.loop.record(trace)
        self.latency.observe(trace)
        if trace.outcome != "aborted":
            self._request_done()

    async def metrics(self, request: Request) -> Response:
        return Response(exposition(self.registry), media_type=CONTENT_TYPE_LATEST)

    async def mtp_stats(self, request: Request) -> Response:
        return JSONResponse(mtp_stats(self.config.snapshot(self.engine)))

    async def timeline(self, request: Request) -> Response:
        assert self.loop is not None
        if request.method == "DELETE":
            self.loop.timeline.clear()
            return JSONResponse({"cleared": True})
        since = request.query_params.get("since", "0")
        if not (since.isascii() and since.isdigit()):
            return error_response(ApiError(400, f"'since' must be a request id (integer >= 0), "
                                                f"got {since!r}", param="since"))
        wall, mono, perf = time.time(), self.clock(), time.perf_counter()
        return JSONResponse({
            "clock": "time.monotonic", "now": mono,
            "wall_minus_monotonic": wall - mono, "perf_counter_minus_monotonic": perf - mono,
            "time_scale": self.config.time_scale, "engine_steps": self.loop.steps,
            "delivery_lag": self.loop.lag.as_json(), "simulated": True,
            "retention": self.loop.timeline.stats(),
            "requests": [t.as_json() for t in self.loop.timeline.since(int(since))],
        })

    async def info(self, request: Request) -> Response:
        return JSONResponse({
            "simulated": True, "persona": self.config.persona, "hardware": self.config.hardware,
            "time_scale": self.config.time_scale, "seed": self.config.seed,
            "served_models": list(self.config.served_models),
            "max_model_len": self.config.max_model_len,
            "faults": list(self.config.faults.active),
            "eval_oracle": len(self.config.oracle) if self.config.oracle else None,
            "delivery_lag": self.loop.lag.as_json() if self.loop else None,
            **dict(self.config.info or {}),
        })

    # -- errors -------------------------------------------------------------------------------

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return error_response(ApiError(exc.status_code, message))

    async def _unexpected(self, request: Request, exc: Exception) -> Response:
        print(f"inferbench-sim: internal error on {request.url.path}: {exc!r}", file=sys.stderr)
        return error_response(ApiError(500, f"internal error in the simulator: {exc!r}"))


def _header_fault(value: str | None) -> None:
    if value is None:
        return
    digits = value.strip()
    if not (digits.isascii() and digits.isdigit()) or not 400 <= int(digits) <= 599:
        raise ApiError(400, f"X-Return-Error must be an HTTP error status (400-599), got "
                            f"{value!r}")
    raise ApiError(int(digits), f"error {int(digits)} requested by the X-Return-Error header "
                               "(simulated)")


def _crash(faults: FaultConfig) -> None:
    print(f"inferbench-sim: fault injection: exiting after {faults.fail_after_requests} "
          f"requests (--fail-after-requests)", file=sys.stderr, flush=True)
    os._exit(FAULT_EXIT_CODE)
