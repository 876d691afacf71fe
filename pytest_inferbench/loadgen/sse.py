"""Server-sent events of an OpenAI completion stream -> chunk times, tokens and usage.

Runs after a stream has ended, on the reads the transport stamped: an event's time is the
arrival of the read that completed it. Tokens per chunk are the deltas of the server's
cumulative `usage.completion_tokens` when it sends one in every chunk
(`stream_options.continuous_usage_stats`), otherwise the count of the chunk's text.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

ERROR_DETAIL_CHARS = 200
# Streams are parsed after they end, by one task, this many events at a time: parsing never
# holds the event loop long enough to delay the stamps of streams still running.
PARSE_SLICE_EVENTS = 64


class StreamFormat(Protocol):
    """What parsing needs to know of the request (the client's `ClientConfig` is one)."""

    @property
    def chat(self) -> bool:
        """Chat completions (`delta.content`) rather than completions (`text`)."""

    @property
    def count_text_tokens(self) -> Callable[[str], int]:
        """Tokens in a chunk's text, for servers that stream no usage."""


@dataclass
class ParsedStream:
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    all_from_usage: bool = True
    done: bool = False
    error: str = ""
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    response_id: str = ""
    usage_tokens_so_far: int = 0

    def feed(self, arrived: float, event: bytes, cfg: StreamFormat) -> None:
        """One SSE event that arrived at `arrived`."""
        payload = b"".join(line[5:].strip() for line in event.split(b"\n")
                           if line.startswith(b"data:"))
        if not payload:
            return
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            self.error = f"malformed stream event: {payload[:80]!r}"
            return
        if not isinstance(obj, dict):
            return
        if "error" in obj:
            err = obj["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            self.error = f"error in stream: {str(message)[:ERROR_DETAIL_CHARS]}"
            return
        self.response_id = self.response_id or str(obj.get("id") or "")
        usage = obj.get("usage") or {}
        completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            self.prompt_tokens = usage["prompt_tokens"]
        choices = obj.get("choices") or []
        if choices and isinstance(choices[0], dict):
            choice = choices[0]
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            text = _choice_text(choice, cfg.chat)
            if isinstance(completion, int):
                tokens = completion - self.usage_tokens_so_far
            else:
                tokens = cfg.count_text_tokens(text) if text else 0
                self.all_from_usage = False
            if text or tokens > 0:
                self.chunk_times.append(arrived)
                self.chunk_tokens.append(tokens)
        if isinstance(completion, int):
            self.usage_tokens_so_far = completion
            self.completion_tokens = completion


def _events(reads: Sequence[tuple[float, bytes]]) -> list[tuple[float, bytes]]:
    """SSE events with the arrival time of the read that completed each one."""
    events: list[tuple[float, bytes]] = []
    pending = bytearray()
    for arrived, data in reads:
        pending += data
        if b"\r" in data:
            pending = bytearray(pending.replace(b"\r\n", b"\n"))
        start = 0
        while (end := pending.find(b"\n\n", start)) >= 0:
            events.append((arrived, bytes(pending[start:end])))
            start = end + 2
        del pending[:start]
    if pending.strip():
        events.append((reads[-1][0], bytes(pending)))
    return events


def _choice_text(choice: dict[str, object], chat: bool) -> str:
    if not chat:
        return str(choice.get("text") or "")
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return ""
    content = delta.get("content") or ""
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    return str(content) + str(reasoning)


def parse_stream(reads: Sequence[tuple[float, bytes]], cfg: StreamFormat) -> ParsedStream:
    out = ParsedStream()
    for arrived, event in _events(reads):
        out.feed(arrived, event, cfg)
    return out


async def parse_stream_in_slices(reads: Sequence[tuple[float, bytes]], cfg: StreamFormat,
                                 slice_events: int = PARSE_SLICE_EVENTS) -> ParsedStream:
    """`parse_stream`, yielding to the event loop every `slice_events` events."""
    out = ParsedStream()
    for i, (arrived, event) in enumerate(_events(reads)):
        if i and i % slice_events == 0:
            await asyncio.sleep(0)
        out.feed(arrived, event, cfg)
    return out
