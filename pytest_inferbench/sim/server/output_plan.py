"""What a simulated request will say: its output tokens' text and its finish reason.

The text is planned up front (oracle answer or filler, cut by stop strings and the token
budget), so the engine is asked for exactly the number of tokens the response will count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...loadgen.tokenizer import filler_tokens, text_to_tokens

if TYPE_CHECKING:
    from .openai_api import GenerationRequest
    from .oracle import Oracle


@dataclass(frozen=True)
class OutputPlan:
    texts: tuple[str, ...]  # one entry per generated token ("" for a swallowed stop token)
    finish_reason: str  # "stop" or "length"
    oracle_hit: bool

    @property
    def tokens(self) -> int:
        return len(self.texts)

    def text(self, start: int, count: int) -> str:
        return "".join(self.texts[start:start + count])


def _cut_at_stop(texts: list[str], stops: tuple[str, ...]) -> int | None:
    """Index of the token whose text completes the first stop string, if any."""
    if not stops:
        return None
    longest = max(len(stop) for stop in stops)
    joined = ""
    for index, text in enumerate(texts):
        joined += text
        # A stop first completed by this token ends inside its text: only the tail can hold
        # it (searching the whole text each time is quadratic in a 16k-token filler answer).
        tail = joined[-(longest + len(text)):]
        if any(stop in tail for stop in stops):
            return index
    return None


def plan_output(request: GenerationRequest, max_tokens: int, oracle: Oracle | None,
                key: str) -> OutputPlan:
    """Oracle answer (stops at its end unless ignore_eos) or filler up to max_tokens."""
    reply = oracle.reply(request.prompt_text) if oracle and request.prompt_text else None
    texts: list[str] = text_to_tokens(reply) if reply is not None else []
    natural_end = reply is not None and len(texts) < max_tokens
    if reply is None or request.ignore_eos:
        texts += filler_tokens(max_tokens - len(texts), key)
        natural_end = False
    texts = texts[:max_tokens]
    stop_at = _cut_at_stop(texts, request.stop)
    if stop_at is not None:
        # The token that completes a stop string is generated (and counted) but not shown.
        return OutputPlan((*texts[:stop_at], ""), "stop", reply is not None)
    if not texts:
        texts = [""]
    return OutputPlan(tuple(texts), "stop" if natural_end else "length", reply is not None)
