"""Prompt text for a `workload.Workload`: what the HTTP client sends.

The workload fixes every request's length and `text_key`; this module only writes text of that
many tokens, in one of two schemes, recorded as `RenderedWorkload.token_source`:

- `tokenizer`: the served model's own tokenizer (optional `transformers` extra, local files
  only: a local path or the Hugging Face cache): random token ids decoded to text and
  re-encoded until the count is exact (as InferenceX).
- `words`: no download needed. One token per whitespace-separated word of a fixed list of short
  common English words, exactly one token in the simulated server's tokenizer
  (`loadgen/tokenizer.py`), so against the simulator the counts are exact. Against a real server
  without its tokenizer they are estimates, and results say so on every table. Every prompt
  starts with a header unique to its text key and continues with a random slice of a seeded
  word pool, so no two prompts share a prefix block.

Requests with the same `text_key` (InferenceX's repeated warmup prompt) get the same text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .tokenizer import chat_prompt_tokens, count_tokens, render_chat
from .workload import Workload, build_workload, prompts_workload

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ..recipe.launch import ClientOptions
    from .workload import LoadSettings, PlannedRequest

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
_PREFIX_KEYS = len(_WORDS) ** _HEADER_WORDS - 1  # shared prefixes take keys from the top down


@dataclass(frozen=True)
class Prompt:
    text: str
    input_tokens: int  # the intended count, template included; usage.prompt_tokens is the truth
    output_tokens: int  # max_tokens


class TextTokenizer(Protocol):
    """The part of a Hugging Face tokenizer the workload uses."""

    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def apply_chat_template(self, conversation: list[dict[str, str]], *,
                            add_generation_prompt: bool, tokenize: bool) -> object: ...


class MissingExtraError(RuntimeError):
    """An optional package a point needs is not installed; the message names the extra."""


# What installs the model's own tokenizer and what its chat templates render with.
TOKENIZER_EXTRA = "pytest-inferbench[tokenizer]"


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


def _tokenizer_text(tok: TextTokenizer, seed: int, key: int, n: int) -> str:
    """InferenceX-style: consecutive ids from a random offset, decoded, then re-fitted to `n`."""
    rng = np.random.RandomState([seed, key])  # one stream per text: keys render alone
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


def template_tokens(tok: TextTokenizer | None) -> int:
    """Tokens the chat template adds to a user prompt (InferenceX's `template_len`); without a
    tokenizer, the simulated server's template."""
    if tok is None:
        return chat_prompt_tokens([("user", "")])
    rendered = _chat_template(tok, "a")
    return len(tok.encode(rendered, add_special_tokens=False)) - 1


def _apply_template(tok: TextTokenizer | None, text: str) -> str:
    if tok is None:
        return render_chat([("user", text)])
    return _chat_template(tok, text)


def _chat_template(tok: TextTokenizer, text: str) -> str:
    """The model's chat template around one user message. Transformers renders it with jinja2
    and raises ImportError when that is missing: a point failure naming the extra."""
    try:
        return str(tok.apply_chat_template([{"role": "user", "content": text}],
                                           add_generation_prompt=True, tokenize=False))
    except ImportError as exc:
        raise MissingExtraError(
            f"the model's chat template cannot be rendered: {exc}; install the tokenizer "
            f"extra: pip install '{TOKENIZER_EXTRA}'") from None




@dataclass(frozen=True)
class RenderedWorkload:
    """A workload with its prompt text: what the HTTP client sends."""

    workload: Workload
    prompts: tuple[Prompt, ...]
    warmup: tuple[Prompt, ...]
    token_source: str  # "tokenizer" or "words"

    @property
    def send_offsets(self) -> tuple[float, ...] | None:
        return self.workload.send_offsets

    @property
    def chat_template(self) -> bool:
        return self.workload.chat_template


def render(workload: Workload, tokenizer: TextTokenizer | None = None) -> RenderedWorkload:
    """Text for every request of `workload`, each of exactly its planned token count."""
    texts: dict[int, str] = {}
    everything = (*workload.requests, *workload.warmup)
    longest = max((r.input_tokens for r in everything), default=1)
    words = None if tokenizer is not None else _WordsText(workload.load.seed, longest)

    prefixes: dict[int, str] = {}
    bodies: dict[int, str] = {}  # untemplated text by text key (a later turn opens with it)
    by_key = {r.text_key: r for r in everything}

    def written(key: int, n: int) -> str:
        if tokenizer is not None:
            return _tokenizer_text(tokenizer, workload.load.seed, key, n)
        assert words is not None
        return words.text(key, n)

    def prompt(request: PlannedRequest) -> Prompt:
        text = texts.get(request.text_key)
        if text is None:
            body = max(request.input_tokens - workload.template_tokens, 1)
            if request.follows is not None:
                # The conversation so far, a stand-in of the earlier reply's planned length,
                # then this turn's own message.
                before = by_key[request.follows]
                history = bodies[request.follows]
                reply = written(_PREFIX_KEYS - 100_000 - request.follows, before.output_tokens)
                own = body - (before.input_tokens - workload.template_tokens) - before.output_tokens
                text = f"{history} {reply} {written(request.text_key, own)}"
            elif workload.texts:
                text = workload.texts[request.text_key]
            elif request.prefix_key is not None and request.prefix_tokens > 0:
                # The group's shared start (keys counted down from the top of the header
                # space, apart from the text keys), then text of the request's own.
                key = _PREFIX_KEYS - request.prefix_key
                shared = prefixes.setdefault(key, written(key, request.prefix_tokens))
                text = f"{shared} {written(request.text_key, body - request.prefix_tokens)}"
            else:
                text = written(request.text_key, body)
            bodies[request.text_key] = text
            if workload.chat_template:
                text = _apply_template(tokenizer, text)
            texts[request.text_key] = text
        return Prompt(text=text, input_tokens=request.input_tokens,
                      output_tokens=request.output_tokens)

    return RenderedWorkload(
        workload=workload,
        prompts=tuple(prompt(r) for r in workload.requests),
        warmup=tuple(prompt(r) for r in workload.warmup),
        token_source="words" if tokenizer is None else "tokenizer")


def point_workload(isl: int, osl: int, conc: int, load: LoadSettings, client: ClientOptions,
                   tokenizer: TextTokenizer | None = None, prompts: tuple[str, ...] = ()
                   ) -> Workload:
    """The one workload of a point, for every backend: the launch spec's client options say
    whether the client templates, and the tokenizer (None: the simulator's) how long the
    template is. Given `prompts` are sent as they are, counted by the same tokenizer."""
    chat_template = client.renders_template
    extra = template_tokens(tokenizer) if chat_template else 0
    count = text_counter(tokenizer)
    if prompts:
        lengths = tuple(count(t) for t in prompts)
        return prompts_workload(prompts, lengths, osl, conc, load, chat_template=chat_template,
                                template_tokens=extra)
    return build_workload(isl, osl, conc, load, chat_template=chat_template,
                          template_tokens=extra, count_tokens=count)


def text_counter(tokenizer: TextTokenizer | None) -> Callable[[str], int]:
    """Tokens of a text: the model's tokenizer, or the simulator's (one per word)."""
    if tokenizer is None:
        return count_tokens
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))
