"""The random dataset of one point, with InferenceX's ISL/OSL semantics.

Lengths: `RandomState(seed).randint(int(L * ratio), L + 1)` for the inputs, then the outputs,
exactly as InferenceX's `sample_random_requests` draws them, so the same seed gives the same
lengths. The ISL includes the chat-template overhead when the template is applied client-side.

Prompt text comes from one of two schemes, recorded in `Workload.token_source`:

- `tokenizer`: the model's own tokenizer (optional `transformers` extra, local files only):
  random token ids decoded to text and re-encoded until the count is exact (as InferenceX).
- `words`: no download needed. One token per whitespace-separated word of a fixed list of short
  common English words, each a single token in the usual BPE vocabularies and exactly one token
  in the simulated server's tokenizer (`sim/tokenizer.py`). The server's `usage.prompt_tokens`
  confirms the count per request. Every prompt starts with a header unique to its index and
  continues with a random slice of a seeded word pool, so no two prompts share a prefix block.

Warmup prompts are distinct (InferenceX repeats the first prompt, which warms the prefix cache
for that one prompt only). An open-loop rate gets a precomputed absolute send schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..sim.tokenizer import chat_prompt_tokens, render_chat

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..backends.base import LoadSettings

# The simulated server's chat template (sim/tokenizer.py): one token per marker word.

_WORDS = (
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "are", "with", "as", "at", "be",
    "this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what", "all",
    "were", "we", "when", "your", "can", "said", "there", "use", "an", "each", "which", "she",
    "do", "how", "their", "if", "will", "up", "other", "about", "out", "many", "then", "them",
    "these", "so", "some", "her", "would", "make", "like", "him", "into", "time", "has", "look",
    "two", "more",
)
_POOL_WORDS = 1 << 16  # the pool only has to be random; uniqueness comes from the header
_HEADER_WORDS = 3  # unique for len(_WORDS) ** 3 = 262144 prompts


@dataclass(frozen=True)
class Prompt:
    text: str
    input_tokens: int  # the intended count, template included; usage.prompt_tokens is the truth
    output_tokens: int  # max_tokens


@dataclass(frozen=True)
class Workload:
    prompts: tuple[Prompt, ...]
    warmup: tuple[Prompt, ...]
    send_offsets: tuple[float, ...] | None  # seconds after the start; None = closed loop
    token_source: str  # "tokenizer" or "words"
    chat_template: bool


class TextTokenizer(Protocol):
    """The part of a Hugging Face tokenizer the workload uses."""

    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


def load_local_tokenizer(model: str) -> TextTokenizer | None:
    """The model's tokenizer from local files, or None (no extra, no files, any load error)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None
    try:
        tokenizer: TextTokenizer = AutoTokenizer.from_pretrained(
            model, local_files_only=True, trust_remote_code=True)
    except Exception:  # any missing file or config problem means: use the words scheme
        return None
    return tokenizer


def sample_lengths(rng: np.random.RandomState, length: int, ratio: float, n: int
                   ) -> list[int]:
    low = max(int(length * ratio), 1) if length > 0 else 0
    return [int(x) for x in rng.randint(low, length + 1, size=n)]


class _WordsText:
    """Prompts of exact word counts: a unique header, then a random slice of a seeded pool."""

    def __init__(self, seed: int, longest: int) -> None:
        rng = np.random.default_rng(seed)
        words = np.array(_WORDS)
        pool_size = max(_POOL_WORDS, longest * 4)
        picks = words[rng.integers(0, len(words), pool_size)]
        self.pool = " ".join(picks.tolist())
        lengths = np.char.str_len(picks) + 1
        self.starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.rng = rng

    def text(self, index: int, n: int) -> str:
        header = [_WORDS[(index // len(_WORDS) ** k) % len(_WORDS)] for k in range(_HEADER_WORDS)]
        if n <= _HEADER_WORDS:
            return " ".join(header[:n])
        body = n - _HEADER_WORDS
        first = int(self.rng.integers(0, self.starts.size - 1 - body))
        tail = self.pool[self.starts[first]: self.starts[first + body] - 1]
        return " ".join(header) + " " + tail


def _tokenizer_text(tok: TextTokenizer, rng: np.random.RandomState, n: int) -> str:
    """InferenceX-style: consecutive ids from a random offset, decoded, then re-fitted to `n`."""
    vocab = int(tok.vocab_size)
    offset = int(rng.randint(0, vocab))
    ids = [(offset + j) % vocab for j in range(n)]
    text = tok.decode(ids)
    for _ in range(10):
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) == n:
            break
        if len(ids) > n:
            ids = ids[:n]
        else:
            ids = ids + [int(x) for x in rng.randint(0, vocab, size=n - len(ids))]
        text = tok.decode(ids)
    return text


def _template_overhead(tok: TextTokenizer | None) -> int:
    if tok is None:
        return chat_prompt_tokens([("user", "")])
    rendered = tok.apply_chat_template([{"role": "user", "content": "a"}],
                                       add_generation_prompt=True, tokenize=False)
    return len(tok.encode(str(rendered), add_special_tokens=False)) - 1


def _apply_template(tok: TextTokenizer | None, text: str) -> str:
    if tok is None:
        return render_chat([("user", text)])
    return str(tok.apply_chat_template([{"role": "user", "content": text}],
                                       add_generation_prompt=True, tokenize=False))


def poisson_offsets(rate: float, n: int, seed: int) -> tuple[float, ...]:
    """Absolute send times of a Poisson process (first request at 0), never rescaled."""
    if not rate > 0 or math.isinf(rate):
        raise ValueError(f"request rate must be a positive finite number, got {rate}")
    gaps = np.random.RandomState(seed + 1).exponential(1.0 / rate, size=n)
    return tuple(float(x) for x in np.concatenate([[0.0], np.cumsum(gaps[:-1])])) if n else ()


def build_workload(isl: int, osl: int, conc: int, load: LoadSettings, *,
                   use_chat_template: bool = False,
                   tokenizer: TextTokenizer | None = None) -> Workload:
    """The prompts of one point: `prompts_per_conc x conc` measured, `warmup_per_conc x conc`
    warmup, lengths and text deterministic in `load.seed`."""
    num = load.prompts_per_conc * conc
    num_warmup = load.warmup_per_conc * conc
    overhead = _template_overhead(tokenizer) if use_chat_template else 0
    body_isl = max(isl - overhead, 1)
    rng = np.random.RandomState(load.seed)
    in_lens = sample_lengths(rng, body_isl, load.range_ratio, num)
    out_lens = sample_lengths(rng, osl, load.range_ratio, num)
    warm_rng = np.random.RandomState(load.seed + 1_000_003)
    warm_in = sample_lengths(warm_rng, body_isl, load.range_ratio, num_warmup)
    warm_out = sample_lengths(warm_rng, osl, load.range_ratio, num_warmup)

    words = None if tokenizer is not None else _WordsText(load.seed, max([*in_lens, *warm_in, 1]))

    def make(index: int, n_in: int, n_out: int) -> Prompt:
        if tokenizer is not None:
            text = _tokenizer_text(tokenizer, rng, n_in)
        else:
            assert words is not None
            text = words.text(index, n_in)
        if use_chat_template:
            text = _apply_template(tokenizer, text)
        return Prompt(text=text, input_tokens=n_in + overhead, output_tokens=n_out)

    prompts = tuple(make(i, a, b) for i, (a, b) in enumerate(zip(in_lens, out_lens, strict=True)))
    warmup = tuple(make(num + i, a, b)
                   for i, (a, b) in enumerate(zip(warm_in, warm_out, strict=True)))
    offsets = None if math.isinf(load.request_rate) else poisson_offsets(
        load.request_rate, num, load.seed)
    return Workload(prompts=prompts, warmup=warmup, send_offsets=offsets,
                    token_source="words" if tokenizer is None else "tokenizer",
                    chat_template=use_chat_template)
