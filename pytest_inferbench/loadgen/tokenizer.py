"""The simulator's deterministic tokenizer and chat template.

The simulated server has no model vocabulary, so it counts tokens by a rule a client can
reproduce without any download:

* **One token per whitespace-separated word.** ``count_tokens(text) == len(text.split())``.
  A prompt of exactly N tokens is any N words joined by spaces; `prompt_of_tokens(n)` builds
  one. Token-id prompts (a list of ints) count one token per id.
* **Output tokens** are words too, each sent with a leading space (``" word"``), so the text of
  any streamed chunk, or of the whole completion, counts back to the number of tokens it
  carries: ``count_tokens(chunk_text) == tokens in the chunk``.
* **Chat template** (deterministic, ChatML-like, one token per marker)::

      <|im_start|>ROLE CONTENT <|im_end|> ... <|im_start|>assistant

  Each message costs ``2 + count_tokens(content)`` tokens and the generation prompt one
  more, so ``chat_prompt_tokens(messages) == sum(2 + words) + 1``. A client that applies the
  template itself (InferenceX ``--use-chat-template``) gets the same count from the rendered
  string: ``count_tokens(render_chat(messages))``.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ASSISTANT_ROLE = "assistant"

# Filler vocabulary for generated text and synthetic prompts: plain lower-case words, none of
# them a stop string an eval harness uses ("Question:", "</s>", "<|im_end|>").
_WORDS = (
    "the", "model", "serves", "tokens", "on", "a", "simulated", "engine", "step", "with",
    "batched", "decode", "and", "chunked", "prefill", "across", "four", "accelerators", "while",
    "every", "request", "streams", "its", "output", "to", "client", "over", "plain", "http",
    "text", "that", "counts", "one", "word", "per", "token", "so", "numbers", "stay", "honest",
)


def count_tokens(text: str) -> int:
    """Tokens in `text`: its whitespace-separated words."""
    return len(text.split())


def prompt_of_tokens(n: int, seed: int = 0) -> str:
    """A prompt of exactly `n` tokens (deterministic for a given seed)."""
    if n < 0:
        raise ValueError(f"token count must be >= 0, got {n}")
    return " ".join(_WORDS[(seed + i) % len(_WORDS)] for i in range(n))


def render_chat(messages: Iterable[tuple[str, str]]) -> str:
    """Apply the chat template to (role, content) pairs, with the generation prompt."""
    parts = [f"{IM_START}{role} {content} {IM_END}" for role, content in messages]
    parts.append(f"{IM_START}{ASSISTANT_ROLE}")
    return " ".join(parts)


def chat_prompt_tokens(messages: Sequence[tuple[str, str]]) -> int:
    """Prompt tokens of a chat request, without rendering it."""
    return sum(2 + count_tokens(content) for _, content in messages) + 1


def filler_tokens(n: int, key: str) -> list[str]:
    """`n` output tokens of filler text, each with its leading space; deterministic per key."""
    start = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big")
    return [" " + _WORDS[(start + i) % len(_WORDS)] for i in range(n)]


def text_to_tokens(text: str) -> list[str]:
    """Split generated text into output tokens (one word each, leading space)."""
    return [" " + word for word in text.split()]
