"""Turning engine deliveries into OpenAI responses: SSE events (vLLM chunk shapes) or one body.

One engine delivery becomes one SSE chunk, so an EAGLE3 step that accepts three tokens sends
them together. Chat streams open with the role chunk at the first token (as vLLM does). The
finish reason rides on the last token's chunk; `stream_options.include_usage` adds a final
chunk with `choices: []` and `usage`; the stream ends with `data: [DONE]`. Truncate and stall
faults end or freeze the stream at a token count, before `[DONE]`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio
    from collections.abc import AsyncIterator

    from .engine_loop import Delivery, EngineLoop
    from .faults import RequestFaults
    from .openai_api import GenerationRequest
    from .output_plan import OutputPlan
    from .timeline import RequestTrace


@dataclass
class Generation:
    """One request in flight: what was asked, what it will say, and how far it got."""

    request: GenerationRequest
    plan: OutputPlan
    faults: RequestFaults
    trace: RequestTrace
    queue: asyncio.Queue[Delivery]
    created: int
    sent: int = 0
    # A mid-stream chunk's event around its JSON-quoted text, rendered once per request:
    # at conc 256 the server sends thousands of chunks a second from one Python process.
    _text_event: tuple[str, str] | None = field(default=None, repr=False)

    def text_event(self, text: str) -> str:
        """The SSE event of a chunk that carries `text` and nothing else (no finish reason, no
        usage): the same bytes as building and encoding the whole chunk."""
        if self._text_event is None:
            marker = json.dumps(uuid.uuid4().hex)
            whole = _sse(self.envelope([_choice(self, json.loads(marker), None)], chunk=True))
            before, _, after = whole.partition(marker)
            self._text_event = (before, after)
        before, after = self._text_event
        return before + json.dumps(text) + after

    def usage(self) -> dict[str, int]:
        prompt = self.request.prompt_tokens
        return {"prompt_tokens": prompt, "completion_tokens": self.sent,
                "total_tokens": prompt + self.sent}

    def envelope(self, choices: list[dict[str, object]], chunk: bool) -> dict[str, object]:
        chat = self.request.kind == "chat"
        if not chat:
            kind = "text_completion"
        else:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        return {"id": self.trace.response_id, "object": kind, "created": self.created,
                "model": self.request.model, "choices": choices}

    def fault_limit(self) -> tuple[int, str] | None:
        """(token count, "truncated" | "stalled") where a fault stops the stream, if any."""
        limits = []
        if self.faults.truncate_after_tokens is not None:
            limits.append((self.faults.truncate_after_tokens, "truncated"))
        if self.faults.stall_after_tokens is not None:
            limits.append((self.faults.stall_after_tokens, "stalled"))
        limits = [(n, mode) for n, mode in limits if n < self.plan.tokens]
        return min(limits) if limits else None


def _sse(payload: dict[str, object] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


def _choice(gen: Generation, text: str, finish_reason: str | None) -> dict[str, object]:
    if gen.request.kind == "chat":
        return {"index": 0, "delta": {"content": text}, "logprobs": None,
                "finish_reason": finish_reason}
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
            "stop_reason": None}


async def _hold(loop: EngineLoop) -> None:
    """A stalled stream: keep the connection open, send nothing, until the client leaves
    (the task is cancelled) or the server shuts down."""
    await loop.closing.wait()


async def stream_events(gen: Generation, loop: EngineLoop) -> AsyncIterator[str]:
    """SSE events of one streamed request; records each emission in its trace."""
    trace = gen.trace
    limit = gen.fault_limit()
    if limit is not None and limit[0] == 0:
        trace.outcome = limit[1]
        loop.abort(trace.request_id)
        if limit[1] == "stalled":
            await _hold(loop)
        return
    while True:
        delivery = await gen.queue.get()
        if loop.interrupted:
            trace.outcome = "error"  # engine died or shutdown: the stream ends without [DONE]
            return
        count = min(delivery.tokens, gen.plan.tokens - gen.sent)
        if limit is not None:
            count = min(count, limit[0] - gen.sent)
        finished = delivery.finished and gen.sent + count >= gen.plan.tokens
        if count <= 0 and not finished:
            continue
        if gen.request.kind == "chat" and gen.sent == 0:
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                    "finish_reason": None}
            opening = gen.envelope([role], chunk=True)
            if gen.request.continuous_usage:
                opening["usage"] = gen.usage()
            yield _sse(opening)
        text = gen.plan.text(gen.sent, count)
        gen.sent += count
        if finished or gen.request.continuous_usage:
            chunk = gen.envelope([_choice(gen, text, gen.plan.finish_reason if finished
                                          else None)], chunk=True)
            if gen.request.continuous_usage:
                chunk["usage"] = gen.usage()
            event = _sse(chunk)
        else:
            event = gen.text_event(text)
        trace.emissions.append((loop.clock(), count))
        trace.planned.append(delivery.step_end)
        yield event
        if finished:
            trace.outcome, trace.finish = "finished", loop.clock()
            if gen.request.include_usage:
                yield _sse({**gen.envelope([], chunk=True), "usage": gen.usage()})
            yield _sse("[DONE]")
            return
        if limit is not None and gen.sent >= limit[0]:
            trace.outcome, trace.finish = limit[1], loop.clock()
            loop.abort(trace.request_id)
            if limit[1] == "stalled":
                await _hold(loop)
            return


async def collect_response(gen: Generation, loop: EngineLoop) -> dict[str, object] | None:
    """The whole non-streamed response body, or None when the engine failed or shut down."""
    trace = gen.trace
    while True:
        delivery = await gen.queue.get()
        if loop.interrupted:
            trace.outcome = "error"
            return None
        count = min(delivery.tokens, gen.plan.tokens - gen.sent)
        if count > 0:
            gen.sent += count
            trace.emissions.append((loop.clock(), count))
            trace.planned.append(delivery.step_end)
        if delivery.finished:
            trace.outcome, trace.finish = "finished", loop.clock()
            break
    text = gen.plan.text(0, gen.sent)
    if gen.request.kind == "chat":
        choice: dict[str, object] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": gen.plan.finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None,
                  "finish_reason": gen.plan.finish_reason, "stop_reason": None}
    return {**gen.envelope([choice], chunk=False), "usage": gen.usage()}
