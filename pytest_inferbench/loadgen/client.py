"""The async HTTP client: streams OpenAI completions and records when every chunk arrived.

A request's `send_time` is when its last bytes went to the socket and `dispatch_time` when the
client set out to send it: TTFT and E2EL are the server's share, and the client's own dispatch
delay is judged by the self-check. Each network read is stamped with `time.perf_counter()` when
the event loop receives it (`transport.py`; on https, when the read is iterated) and its bytes
are kept; SSE splitting and JSON parsing happen after the stream ends, so parsing never delays
a timestamp. An event's time is the arrival of the read that completed it.

Tokens per chunk come from `stream_options.continuous_usage_stats` (the server's cumulative
`usage.completion_tokens` in every chunk) when the server sends it, otherwise from counting
the chunk text (`ClientConfig.count_text_tokens`). `usage.completion_tokens` of the final
chunk is the request's output count; the chunk sum is the cross-check.

Every request becomes a `RequestRecord`. Failures -- HTTP errors, connection errors, timeouts,
error events, streams that end without `[DONE]`, no token at all, or fewer tokens than
`max_tokens` under `ignore_eos` -- have `success=False` and a reason; none is dropped.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx
import numpy as np

from ..results.metrics import RequestRecord
from ..util.aio import cancel_and_wait
from .sse import ERROR_DETAIL_CHARS, ParsedStream, parse_stream, parse_stream_in_slices
from .tokenizer import count_tokens
from .transport import arrival_of, written_at
from .workload import DEFAULT_STALL_TIMEOUT_S

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ..results.record import JSONValue
    from .prompts import Prompt

CHAT_ENDPOINT = "/v1/chat/completions"
COMPLETIONS_ENDPOINT = "/v1/completions"
# Reasons of a read timeout and of the point's deadline, until the tokens received before them
# are counted (`_record`).
STALLED = "stalled"
DEADLINE = "deadline"
# How a request that lost its server begins its error: no connection, or the one it had gone.
CONNECTION_FAILED = "connection failed"
CONNECTION_CLOSED = "connection closed mid-stream"
_LOST_PREFIXES = (CONNECTION_FAILED, CONNECTION_CLOSED, "ConnectTimeout:", "WriteTimeout:")
# Chunk tokens counted as words of a real model's text: an estimate, not a cross-check.
APPROXIMATE_WORDS = "words (approximate)"


@dataclass(frozen=True)
class Timeouts:
    """connect: TCP connect; read: the longest silence between two reads of a stream (a long
    prefill under queueing can take minutes); write: sending the request body."""

    connect_s: float = 30.0
    read_s: float = DEFAULT_STALL_TIMEOUT_S
    write_s: float = 60.0

    def httpx(self) -> httpx.Timeout:
        # pool=None: a request waits for a free connection only when the pool is smaller than
        # the concurrency, which `connections.make_http_client` never allows.
        return httpx.Timeout(connect=self.connect_s, read=self.read_s, write=self.write_s,
                             pool=None)


@dataclass(frozen=True)
class ClientConfig:
    base_url: str
    model: str
    endpoint: str = COMPLETIONS_ENDPOINT
    concurrency: int = 1
    timeouts: Timeouts = field(default_factory=Timeouts)
    api_key: str | None = None
    continuous_usage: bool = True
    ignore_eos: bool = True
    count_text_tokens: Callable[[str], int] = count_tokens
    text_token_source: str = "words"
    point_deadline_s: float | None = None  # requests still open this long after the start fail

    @property
    def chat(self) -> bool:
        return self.endpoint.rstrip("/").endswith("/chat/completions")

    @property
    def tls(self) -> bool:
        return self.base_url.startswith("https")


def request_body(cfg: ClientConfig, prompt: Prompt) -> dict[str, JSONValue]:
    """The InferenceX payload: temperature 0, max tokens = OSL, ignore_eos, usage in the stream."""
    options: dict[str, JSONValue] = {"include_usage": True}
    if cfg.continuous_usage:
        options["continuous_usage_stats"] = True
    body: dict[str, JSONValue] = {
        "model": cfg.model, "temperature": 0.0, "stream": True, "stream_options": options,
        "ignore_eos": cfg.ignore_eos,
    }
    if cfg.chat:
        body["messages"] = [{"role": "user", "content": prompt.text}]
        body["max_completion_tokens"] = prompt.output_tokens
    else:
        body["prompt"] = prompt.text
        body["max_tokens"] = prompt.output_tokens
    return body


def _http_error(status: int, body: bytes) -> str:
    message = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(body)
        if isinstance(obj, dict):
            err = obj.get("error", obj.get("detail", obj))
            message = str(err.get("message", err) if isinstance(err, dict) else err)
    except ValueError:
        pass
    return f"HTTP {status}: {message[:ERROR_DETAIL_CHARS]}"


def _exception_reason(exc: BaseException, cfg: ClientConfig) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"{CONNECTION_FAILED}: {exc}"
    if isinstance(exc, httpx.ReadTimeout):
        return STALLED
    if isinstance(exc, httpx.TimeoutException):
        return f"{type(exc).__name__}: timed out"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError,
                        httpx.CloseError)):  # the server went away mid-request
        return f"{CONNECTION_CLOSED} ({type(exc).__name__}: {exc})"
    return f"{type(exc).__name__}: {exc}"


def server_lost(error: str) -> bool:
    """Did a request's raw error (`RawResponse.error`, before `_record` words it) lose the
    server rather than get its answer: a stream silent past the stall timeout, or no
    connection, or the one it had gone? An HTTP error or a stream the server ended itself
    is an answer."""
    return error == STALLED or error.startswith(_LOST_PREFIXES)


def _record(prompt: Prompt, cfg: ClientConfig, sent: float, ended: float,
            reads: Sequence[tuple[float, bytes]], error: str,
            scheduled: float | None, dispatched: float | None = None,
            parsed: ParsedStream | None = None) -> RequestRecord:
    if parsed is None:
        parsed = parse_stream(reads, cfg) if reads else ParsedStream()
    chunk_sum = sum(parsed.chunk_tokens)
    output = parsed.completion_tokens if parsed.completion_tokens is not None else chunk_sum
    if error == STALLED:
        error = (f"no data for {cfg.timeouts.read_s:g} s after token {chunk_sum} "
                 "(--inferbench-stall-timeout)")
    elif error == DEADLINE:
        error = (f"the point's deadline of {cfg.point_deadline_s:g} s passed after token "
                 f"{chunk_sum} (--inferbench-point-timeout)")
    if not error:
        if parsed.error:
            error = parsed.error
        elif not parsed.done:
            error = "stream ended without [DONE]"
        elif not parsed.chunk_times:
            error = "no token received"
        elif cfg.ignore_eos and output < prompt.output_tokens:
            error = (f"output stopped early under ignore_eos (finish_reason="
                     f"{parsed.finish_reason})")
    source = "usage" if parsed.chunk_times and parsed.all_from_usage else cfg.text_token_source
    return RequestRecord(
        send_time=sent, end_time=ended,
        input_tokens=parsed.prompt_tokens if parsed.prompt_tokens is not None
        else prompt.input_tokens,
        output_tokens=output, success=not error,
        chunk_times=np.asarray(parsed.chunk_times, dtype=np.float64),
        chunk_tokens=np.asarray(parsed.chunk_tokens, dtype=np.int64),
        error=error, token_source=source, request_id=parsed.response_id,
        scheduled_time=scheduled, dispatch_time=dispatched)


@dataclass(frozen=True)
class RawResponse:
    """A finished request before parsing: the stamped reads and what went wrong, if anything."""

    prompt: Prompt
    sent: float
    ended: float
    reads: list[tuple[float, bytes]]
    error: str
    scheduled: float | None
    dispatched: float

    async def record(self, cfg: ClientConfig) -> RequestRecord:
        parsed = await parse_stream_in_slices(self.reads, cfg) if self.reads else ParsedStream()
        return _record(self.prompt, cfg, self.sent, self.ended, self.reads, self.error,
                       self.scheduled, self.dispatched, parsed)


def build_request(client: httpx.AsyncClient, cfg: ClientConfig, prompt: Prompt) -> httpx.Request:
    return client.build_request("POST", cfg.endpoint, json=request_body(cfg, prompt))


async def send_raw(client: httpx.AsyncClient, cfg: ClientConfig, prompt: Prompt,
                   scheduled: float | None = None,
                   on_read: Callable[[], None] | None = None,
                   request: httpx.Request | None = None,
                   expired: asyncio.Event | None = None) -> RawResponse:
    """One streamed request, unparsed; never raises for a server or network failure.

    `request` may be built ahead (`build_request`), keeping that work out of the dispatch.
    """
    reads: list[tuple[float, bytes]] = []
    stamp = time.perf_counter
    error = ""
    dispatched = stamp()
    sent = dispatched
    try:
        if request is None:
            request = build_request(client, cfg, prompt)
        response = await client.send(request, stream=True)
        try:
            sent = written_at(response) or dispatched
            if response.status_code != 200:
                error = _http_error(response.status_code, await response.aread())
            else:
                async for data in response.aiter_raw():
                    reads.append((arrival_of(response) or stamp(), data))
                    if on_read is not None:
                        on_read()
        finally:
            await response.aclose()
    except httpx.HTTPError as exc:
        error = _exception_reason(exc, cfg)
    except asyncio.CancelledError:
        if expired is None or not expired.is_set():
            raise
        error = DEADLINE  # cancelled by the point's deadline: what came so far is kept
    return RawResponse(prompt, sent, stamp(), reads, error, scheduled, dispatched)


class _RecordBuilder:
    """One task that turns finished streams into records, in submission order."""

    def __init__(self, cfg: ClientConfig, records: list[RequestRecord | None],
                 on_record: Callable[[RequestRecord], None] | None) -> None:
        self.cfg = cfg
        self.records = records
        self.on_record = on_record
        self.queue: asyncio.Queue[tuple[int, RawResponse]] = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._run(), name="inferbench-parse")

    async def _run(self) -> None:
        while True:
            index, raw = await self.queue.get()
            try:
                try:
                    record = await raw.record(self.cfg)
                except Exception as exc:  # a parser bug must not lose the request
                    record = _record(raw.prompt, self.cfg, raw.sent, raw.ended, [],
                                     f"client could not read the response: {exc!r}",
                                     raw.scheduled, raw.dispatched)
                self.records[index] = record
                if self.on_record is not None:
                    self.on_record(record)
            finally:
                self.queue.task_done()

    async def finish(self) -> None:
        await self.queue.join()
        await cancel_and_wait(self.task)


@dataclass(frozen=True)
class LoadRun:
    records: tuple[RequestRecord, ...]  # in prompt order
    start: float
    end: float

    @property
    def duration_s(self) -> float:
        return self.end - self.start


async def run_load(slots: Sequence[httpx.AsyncClient], cfg: ClientConfig,
                   prompts: Sequence[Prompt], *, send_offsets: Sequence[float] | None = None,
                   on_record: Callable[[RequestRecord], None] | None = None,
                   on_read: Callable[[], None] | None = None,
                   chains: Sequence[Sequence[int]] | None = None) -> LoadRun:
    """Closed loop with one worker per slot (offsets None), or an open loop sending prompt i at
    start + offsets[i] as soon as a slot is free; at most `len(slots)` requests in flight.
    `chains` (closed loop): sequences a worker sends one after another (a conversation's turns);
    default: each prompt alone."""
    records: list[RequestRecord | None] = [None] * len(prompts)
    builder = _RecordBuilder(cfg, records, on_record)

    def done(index: int, raw: RawResponse) -> None:
        builder.queue.put_nowait((index, raw))

    # Built before the clock starts: a closed loop re-dispatches many slots in the same loop
    # turn when a step ends, and every microsecond each dispatch costs delays the stamps of
    # the chunks arriving meanwhile.
    requests = [build_request(slots[0], cfg, p) for p in prompts] if slots else []

    expired = asyncio.Event()

    def not_sent(index: int, scheduled: float | None = None) -> None:
        now = time.perf_counter()
        done(index, RawResponse(prompts[index], now, now, [], "not sent: the point's deadline "
                                f"of {cfg.point_deadline_s:g} s had passed "
                                "(--inferbench-point-timeout)", scheduled, now))

    start = time.perf_counter()
    tasks: list[asyncio.Future[None]] = []
    if send_offsets is None:
        # Workers share the chains; a worker sends its chain's requests one after another.
        next_chain = iter(chains if chains is not None else [[i] for i in range(len(prompts))])

        async def worker(client: httpx.AsyncClient) -> None:
            for chain in next_chain:
                for index in chain:
                    if expired.is_set():
                        not_sent(index)
                        continue
                    done(index, await send_raw(client, cfg, prompts[index], on_read=on_read,
                                               request=requests[index], expired=expired))

        tasks = [asyncio.ensure_future(worker(c)) for c in slots[: len(prompts)]]
    else:
        if len(send_offsets) != len(prompts):
            raise ValueError(f"{len(send_offsets)} send times for {len(prompts)} prompts")
        free: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
        for client in slots:
            free.put_nowait(client)

        async def scheduled(index: int) -> None:
            due = start + send_offsets[index]
            try:
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                client = await free.get()
            except asyncio.CancelledError:
                if not expired.is_set():
                    raise
                not_sent(index, due)
                return
            try:
                done(index, await send_raw(client, cfg, prompts[index], scheduled=due,
                                           on_read=on_read, request=requests[index],
                                           expired=expired))
            finally:
                free.put_nowait(client)

        tasks = [asyncio.ensure_future(scheduled(i)) for i in range(len(prompts))]

    def expire() -> None:
        expired.set()
        for task in tasks:
            task.cancel()

    timer = (asyncio.get_running_loop().call_later(cfg.point_deadline_s, expire)
             if cfg.point_deadline_s is not None else None)
    try:
        await asyncio.gather(*tasks)
    finally:
        if timer is not None:
            timer.cancel()
    end = time.perf_counter()  # the last stream has ended; parsing is not part of the run
    await builder.finish()
    return LoadRun(records=tuple(r for r in records if r is not None), start=start, end=end)
