"""A replayed turn's prompt, synthesized from the trace's block hashes (agentic.md §2.3, §3.3).

A trace holds no text, only each prompt's 64-token block hashes. A block's text is 64 filler
words drawn from a seed of (trace id, hash id), so equal hashes give equal text and the prompt
of every turn has the recorded cache structure: it starts with exactly the blocks it shares
with what the tree sent before. The part of `in` past the blocks is seeded tail text of its
own; a prompt shorter than its blocks ends inside its last block.

Every play of a tree (root and subagents alike) opens its prompts with its own cache-bust
marker `[rid:<12 hex>]` (§3.3 item 6): no cache is shared across lanes, recycled plays or runs.
The marker takes the place of the stream's first words, so it costs no token:

- completions: the prompt is `marker + stream[1:in]`, `in` tokens;
- chat: one user message `marker + stream[2:in]`; the chat header stands for `stream[0]`, so
  the rendered prompt's token j is stream token j for 2 <= j < in and every full block lies
  where the trace puts it; the template's closing two tokens come past `in` (in + 2 tokens).

The full history is re-sent every turn (§3.4 "Prompt building"): the stream of turn k holds all
its blocks, those of earlier turns first. Unlike AIPerf it is one user message, not alternating
user/assistant messages: the template tokens between messages would shift every later block.
Words are the simulator's tokens exactly; for a real tokenizer the block lengths are approximate.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

import numpy as np

from .tokenizer import _WORDS
from .traces import shared_prefix_blocks

if TYPE_CHECKING:
    import numpy.typing as npt

    from .trace_sessions import Turn

MARKER_HEX = 12
# The chat template's tokens before the content (`<|im_start|>user`) and after it.
CHAT_HEAD_TOKENS = 1
CHAT_TAIL_TOKENS = 2


def marker(run_id: str, play: int, lane: int, trace_id: str) -> str:
    """The cache-bust marker of one play of a tree: one word, fresh per run, play and lane."""
    digest = hashlib.sha256(f"{run_id}:{play}:{lane}:{trace_id}".encode()).hexdigest()
    return f"[rid:{digest[:MARKER_HEX]}]"


_MARKER = re.compile(rf"\[rid:[0-9a-f]{{{MARKER_HEX}}}\]")


def play_of(prompt_text: str) -> str | None:
    """The marker of the play a prompt belongs to (its first word, or the first after the chat
    header), None for a prompt the replay did not send: how a server tells a play's requests
    from others, as InferenceX's deployments tell a session's by its header."""
    words = prompt_text.split(maxsplit=CHAT_HEAD_TOKENS + 1)[:CHAT_HEAD_TOKENS + 1]
    return next((w for w in words if _MARKER.fullmatch(w)), None)


def _words(seed: str, n: int) -> list[str]:
    """`n` filler words from `seed`: a word per digest byte, so two seeds' texts differ."""
    out: list[str] = []
    counter = 0
    size = len(_WORDS)
    while len(out) < n:
        digest = hashlib.blake2b(f"{seed}:{counter}".encode(), digest_size=64).digest()
        out.extend(_WORDS[b % size] for b in digest)
        counter += 1
    return out[:n]


class BlockText:
    """The words of a trace's blocks, drawn once per (trace, hash id)."""

    def __init__(self, trace_id: str, block_size: int, seed: int = 0) -> None:
        self.trace_id = trace_id
        self.block_size = block_size
        self.seed = seed
        self._blocks: dict[int, list[str]] = {}

    def block(self, hash_id: int) -> list[str]:
        words = self._blocks.get(hash_id)
        if words is None:
            words = self._blocks[hash_id] = _words(f"{self.seed}:{self.trace_id}:{hash_id}",
                                                   self.block_size)
        return words

    def stream(self, turn: Turn) -> list[str]:
        """The turn's prompt as words: its blocks, cut or extended to its `in` tokens."""
        r = turn.request
        words: list[str] = []
        for h in r.hash_ids:
            if len(words) >= r.input_length:
                break
            words.extend(self.block(h))
        if len(words) < r.input_length:  # past the hashed blocks: this turn's own tail
            words.extend(_words(f"{self.seed}:{self.trace_id}:{turn.session_id}:{turn.index}",
                                r.input_length - len(words)))
        return words[:r.input_length]


def prompt_text(words: list[str], rid: str, *, chat: bool) -> str:
    """The text sent for a turn's word stream under the marker `rid` (see the module doc)."""
    skip = 1 + CHAT_HEAD_TOKENS if chat else 1
    return rid + "\n\n" + " ".join(words[skip:])


def prompt_tokens(input_length: int, *, chat: bool) -> int:
    """The prompt tokens the simulator counts for a turn of `input_length` tokens."""
    if chat:
        return max(input_length, CHAT_HEAD_TOKENS + 1) + CHAT_TAIL_TOKENS
    return max(input_length, 1)


def prompt_block_keys(turn: Turn, trace_block_size: int, play: int, block_size: int, *,
                      chat: bool, known: tuple[int, ...] = ()) -> tuple[int, ...]:
    """A key for each full `block_size` block of the prompt sent for `turn` in play `play`,
    without building its text: two blocks' keys are equal exactly where the simulated server's
    content hashes of the sent prompts are (`sim.prefix_cache.block_hashes`, each hash standing
    for its block and all before it), so an engine fed these keys caches as the server does.

    A prefix of the sent tokens is known by the play (its marker; the chat header before it
    alone is every prompt's), the stream words it covers (the trace blocks they lie in, past
    them the turn's own tail) and, past the `in` words, how many of the chat template's
    closing tokens it holds.
    `known`: the keys of its leading blocks where the caller has them (`PromptKeys`); only
    the blocks past them are mixed, few (an engine's 16 tokens or more) one by one in Python
    integers, many (one-token blocks) in one vectorized pass: the same keys either way."""
    r = turn.request
    words = r.input_length
    blocks = prompt_tokens(words, chat=chat) // block_size
    if blocks < 1:
        return ()
    hashed = min(words, len(r.hash_ids) * trace_block_size)  # words drawn from trace blocks
    chain = [hash(play)]  # chain[k]: the play and its first k trace blocks
    for h in r.hash_ids[:-(-hashed // trace_block_size)]:
        chain.append(hash((chain[-1], h)))
    chain.append(hash((chain[-1], turn.session_id, turn.index)))  # past them: the turn's tail
    start = min(len(known), blocks)
    if blocks - start > VECTOR_BLOCKS:
        return known[:start] + _vector_keys(chain, words, hashed, trace_block_size, start,
                                            blocks, block_size, chat=chat)
    keys = list(known[:start])
    header = CHAT_HEAD_TOKENS if chat else 0
    for end in range((start + 1) * block_size, (blocks + 1) * block_size, block_size):
        if end <= header:  # a block of the chat header alone (a one-token block)
            key = _mix_int(0, end)
        else:
            covered = end if end < words else words
            head = chain[-(-covered // trace_block_size) if covered <= hashed else -1]
            key = _mix_int(_mix_int(head & _U64, covered), end - covered)
        keys.append(key - _2_64 if key >> 63 else key)  # as a signed 64-bit integer
    return tuple(keys)


# Up to this many blocks a prompt's keys are mixed afresh: looking up the previous turn's
# costs about as much as mixing them.
FEW_BLOCKS = 8


class PromptKeys:
    """`prompt_block_keys` of one replay's prompts at one engine block size. A stream's turn
    re-sends the stream's previous prompt and extends it, so its leading blocks' keys are
    the previous turn's (the same play, the same trace blocks over the same words): only the
    blocks past the prefix the two share are mixed (the keys of any earlier prompt of the
    play would do: what the two share is checked). The previous prompt is kept per
    (play, stream) until the stream's last turn."""

    def __init__(self, block_size: int, *, chat: bool) -> None:
        self.block_size = block_size
        self.chat = chat
        self.reused = 0  # keys taken from a previous turn's
        self._last: dict[tuple[int, str], tuple[tuple[int, ...], int, tuple[int, ...]]] = {}

    def __call__(self, turn: Turn, trace_block_size: int, play: int, *,
                 last: bool) -> tuple[int, ...]:
        """The keys of `turn`'s prompt in play `play`; `last`: its stream's last turn."""
        r = turn.request
        stream = (play, turn.session_id)
        if prompt_tokens(r.input_length, chat=self.chat) // self.block_size <= FEW_BLOCKS:
            if last:
                self._last.pop(stream, None)
            return prompt_block_keys(turn, trace_block_size, play, self.block_size,
                                     chat=self.chat)
        previous = self._last.pop(stream, None)
        hashed = min(r.input_length, len(r.hash_ids) * trace_block_size)
        known: tuple[int, ...] = ()
        if previous is not None:
            ids, was_hashed, keys = previous
            # Blocks that both prompts fill from the same leading trace blocks: their keys.
            shared = (len(ids) if r.hash_ids[:len(ids)] == ids
                      else shared_prefix_blocks(ids, r.hash_ids))
            known = keys[:min(was_hashed, hashed, shared * trace_block_size) // self.block_size]
            self.reused += len(known)
        out = prompt_block_keys(turn, trace_block_size, play, self.block_size, chat=self.chat,
                                known=known)
        if not last:
            self._last[stream] = (r.hash_ids, hashed, out)
        return out


# Above this many blocks a prompt's keys are mixed as numpy arrays: per block they cost less
# than Python integers, per call more (a dozen array operations).
VECTOR_BLOCKS = 48

_M1 = 0x9E3779B97F4A7C15
_M2 = 0xBF58476D1CE4E5B9
_U64 = (1 << 64) - 1
_2_64 = 1 << 64


def _vector_keys(chain: list[int], words: int, hashed: int, trace_block_size: int,
                 start: int, blocks: int, block_size: int, *, chat: bool) -> tuple[int, ...]:
    """`prompt_block_keys` of blocks `start` .. `blocks` - 1, mixed as arrays."""
    ends = np.arange(start + 1, blocks + 1, dtype=np.int64) * block_size
    covered = np.minimum(ends, words)
    which = np.where(covered <= hashed, -(-covered // trace_block_size), len(chain) - 1)
    head = np.asarray(chain, dtype=np.int64)[which].view(np.uint64)
    keys = _mix(_mix(head, covered), ends - covered)
    if chat:  # a block of the chat header alone (a one-token block) is every prompt's
        header = ends <= CHAT_HEAD_TOKENS
        keys[header] = _mix(np.zeros(int(header.sum()), np.uint64), ends[header])
    out: tuple[int, ...] = tuple(keys.view(np.int64).tolist())
    return out


def _mix_int(key: int, value: int) -> int:
    """`_mix` of one unsigned 64-bit key and a non-negative value, in Python integers."""
    x = key ^ ((value * _M1) & _U64)
    x = ((x ^ (x >> 31)) * _M2) & _U64
    return x ^ (x >> 29)


def _mix(keys: npt.NDArray[np.uint64], values: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
    """One 64-bit key for each (key, value) pair (a multiply-xorshift mix: distinct pairs
    collide with a chance of about 2**-64; `_mix_int` is the same mix for one pair)."""
    with np.errstate(over="ignore"):
        x = keys ^ (values.astype(np.uint64) * np.uint64(_M1))
        x = (x ^ (x >> np.uint64(31))) * np.uint64(_M2)
        mixed: npt.NDArray[np.uint64] = x ^ (x >> np.uint64(29))
    return mixed
