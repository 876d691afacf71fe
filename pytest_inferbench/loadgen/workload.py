"""The workload of one point: which requests are sent, how long each is, and when.

One `Workload` drives every backend: the in-process simulator feeds its lengths and send
offsets to the virtual-time driver, and the HTTP client renders the same requests to text
(`loadgen/prompts.py`) and sends them on the same schedule. So `sim` and `sim-server` send the
same requests at the same offsets for the same seed, and nothing else draws a workload.

InferenceX semantics (vLLM `benchmark_serving`, random dataset):

- Lengths: `RandomState(seed).randint(int(L * ratio), L + 1)` for the inputs, then the outputs,
  as `sample_random_requests` draws them; ratio 1.0 gives fixed lengths. The ISL includes the
  chat-template overhead when the client applies the template (`template_tokens`).
- Warmup, `same` (the default, as InferenceX): `warmup_per_conc x C` copies of the first
  request. `distinct`: as many requests of their own, drawn from another stream, so a prefix
  cache is not warmed for the first prompt alone. `same` is the default because results are
  meant to sit next to InferenceX's: the recipes' servers run without prefix caching, where
  the two warm the same graphs and batch shapes.
- Closed loop (`request_rate` inf): every request is due at once; at most C are in flight.
  Open loop: Poisson arrivals at absolute offsets from the start, never rescaled, still capped
  at C in flight (benchmark_serving's gamma intervals with burstiness 1).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, overload

import numpy as np

from .datasets import RANDOM, DatasetError, DatasetSpec, text_prompts

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import numpy.typing as npt

    from ..results.record import JSONValue

    IntArray = npt.NDArray[np.int64]

WARMUP_MODES = ("same", "distinct")
DEFAULT_RANGE_RATIO = 0.8  # InferenceX's RANDOM_RANGE_RATIO
# A request that receives nothing for this long fails: long enough for a long prefill behind a
# full queue, short enough that a stalled stream does not hold a point for a proxy's 15 min.
DEFAULT_STALL_TIMEOUT_S = 300.0
# InferenceX's agentic benchmark duration (agentic.md §1.3 "Duration"), where each lane's first
# tree starts (--trajectory-start-min-ratio / -max-ratio) and the warmup requests per lane after
# its primers (§3.1, §3.3); its fast mode (AIPERF_EXPERIMENTAL_FAST, §5) runs 1200 s after one.
DEFAULT_REPLAY_DURATION_S = 3600.0
TRAJECTORY_START_RATIOS = (0.25, 0.75)
WARMUP_REQUESTS_PER_LANE = 10
FAST_REPLAY_DURATION_S = 1200.0
FAST_WARMUP_REQUESTS_PER_LANE = 1
_DISTINCT_WARMUP_STREAM = 1_000_003  # seed offset of the distinct warmups' lengths
# numpy's RandomState takes seeds below 2**32; the warmup stream adds its offset to the seed.
MAX_SEED = 2**32 - 1 - _DISTINCT_WARMUP_STREAM


@dataclass(frozen=True)
class LoadSettings:
    """How one point loads its server (InferenceX defaults)."""

    prompts_per_conc: int = 10
    warmup_per_conc: int = 2
    range_ratio: float = DEFAULT_RANGE_RATIO
    seed: int = 0
    request_rate: float = math.inf  # inf = closed loop at the concurrency
    warmup: str = "same"  # or "distinct" (WARMUP_MODES)
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    point_timeout_s: float | None = None  # deadline of one load (HTTP backends)
    dataset: DatasetSpec = RANDOM  # what the prompts are drawn from (`datasets.py`)
    # Agentic-coding points (`replay.py`): the traces file (None: seeded synthetic traces), the
    # seconds of replay, where each lane's first tree starts and its warmup requests.
    traces: Path | None = None
    replay_duration_s: float = DEFAULT_REPLAY_DURATION_S
    trajectory_start: tuple[float, float] = TRAJECTORY_START_RATIOS
    warmup_per_lane: int = WARMUP_REQUESTS_PER_LANE

    def __post_init__(self) -> None:
        if not 0.0 <= self.range_ratio <= 1.0:
            raise ValueError(f"random range ratio must be within [0, 1], got {self.range_ratio}")
        if self.warmup not in WARMUP_MODES:
            raise ValueError(f"warmup must be one of {', '.join(WARMUP_MODES)}, "
                             f"got {self.warmup!r}")


class PlannedRequest(NamedTuple):
    """One request: its prompt length (template included), `max_tokens`, and which prompt text
    it carries (`text_key`: equal keys mean the very same prompt). A named tuple, not a
    dataclass: a matrix point draws tens of thousands, and a tuple is built in a third of
    the time."""

    input_tokens: int
    output_tokens: int
    text_key: int
    prefix_key: int | None = None  # requests with the same key start with the same text ...
    prefix_tokens: int = 0  # ... of this many tokens
    # Multi-turn: the text key of the earlier turn that must have finished before this one is
    # sent; its prompt and reply open this prompt.
    follows: int | None = None


class DrawnRequests(Sequence[PlannedRequest]):
    """Plain drawn requests held as their two length columns (request i has text key
    `first_key + i`, no prefix, follows nothing); a `PlannedRequest` is built only when one
    is read. A matrix keeps dozens of drawn workloads of up to ten thousand requests each,
    which as tuples cost their drawing time again in the garbage collector's passes."""

    __slots__ = ("first_key", "inputs", "outputs")

    def __init__(self, inputs: IntArray, outputs: IntArray, first_key: int) -> None:
        for array in (inputs, outputs):
            array.flags.writeable = False  # shared by every reader of a cached workload
        self.inputs, self.outputs, self.first_key = inputs, outputs, first_key

    def __len__(self) -> int:
        return len(self.inputs)

    @overload
    def __getitem__(self, index: int) -> PlannedRequest: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[PlannedRequest, ...]: ...

    def __getitem__(self, index: int | slice) -> PlannedRequest | tuple[PlannedRequest, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        position = range(len(self))[index]  # negative indices, IndexError
        return PlannedRequest(int(self.inputs[position]), int(self.outputs[position]),
                              self.first_key + position)

    def __iter__(self) -> Iterator[PlannedRequest]:
        return map(PlannedRequest, self.inputs.tolist(), self.outputs.tolist(),
                   range(self.first_key, self.first_key + len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DrawnRequests):
            return (self.first_key == other.first_key
                    and np.array_equal(self.inputs, other.inputs)
                    and np.array_equal(self.outputs, other.outputs))
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # equal by value, and mutable-looking arrays


Requests = Sequence[PlannedRequest]  # a tuple of them, or `DrawnRequests`


def _length_arrays(requests: Requests) -> tuple[IntArray, IntArray]:
    if isinstance(requests, DrawnRequests):
        return requests.inputs, requests.outputs
    arrays = (np.fromiter((r.input_tokens for r in requests), np.int64, len(requests)),
              np.fromiter((r.output_tokens for r in requests), np.int64, len(requests)))
    for array in arrays:
        array.flags.writeable = False  # shared by every reader of a cached workload
    return arrays


@dataclass(frozen=True)
class Workload:
    requests: Requests  # the measured requests, in send order
    warmup: Requests  # sent first, under the same concurrency cap; unmeasured
    send_offsets: tuple[float, ...] | None  # seconds after the start; None = closed loop
    concurrency: int
    chat_template: bool  # the client renders the chat template into every prompt
    template_tokens: int  # the template's tokens, counted inside every input length
    load: LoadSettings
    # Given prompt texts, by `text_key` (a test's own prompts); empty: drawn random prompts.
    texts: tuple[str, ...] = ()

    def chains(self) -> list[list[int]]:
        """The measured requests as sequences that run one after another on one connection:
        a conversation's turns, or each request alone."""
        chains: dict[int, list[int]] = {}
        head: dict[int, int] = {}  # text key -> the text key its chain starts with
        for i, r in enumerate(self.requests):
            start = r.text_key if r.follows is None else head[r.follows]
            head[r.text_key] = start
            chains.setdefault(start, []).append(i)
        return list(chains.values())

    @functools.cached_property
    def conversational(self) -> bool:
        """Whether some request follows another (a conversation's turns); else `chains()` is
        each request alone."""
        if isinstance(self.requests, DrawnRequests):
            return False
        return any(r.follows is not None for r in self.requests)

    @functools.cached_property
    def length_arrays(self) -> tuple[IntArray, IntArray]:
        """Input and output lengths of the measured requests (read-only arrays)."""
        return _length_arrays(self.requests)

    @functools.cached_property
    def warmup_length_arrays(self) -> tuple[IntArray, IntArray]:
        return _length_arrays(self.warmup)

    @property
    def input_lens(self) -> list[int]:
        lengths: list[int] = self.length_arrays[0].tolist()
        return lengths

    @property
    def output_lens(self) -> list[int]:
        lengths: list[int] = self.length_arrays[1].tolist()
        return lengths

    def describe(self) -> dict[str, JSONValue]:
        """How this workload was drawn, for the result record."""
        load = self.load
        return {
            "dataset": ("prompts" if self.texts and load.dataset.kind == "random"
                        else load.dataset.describe()), "seed": load.seed,
            "random_range_ratio": load.range_ratio,
            "prompts_per_conc": load.prompts_per_conc, "warmup": load.warmup,
            "num_warmups": len(self.warmup),
            "request_rate": "inf" if math.isinf(load.request_rate) else load.request_rate,
            "chat_template": self.chat_template, "template_tokens": self.template_tokens,
        }


def sample_lengths(rng: np.random.RandomState, length: int, ratio: float, n: int) -> IntArray:
    low = max(int(length * ratio), 1) if length > 0 else 0
    return rng.randint(low, length + 1, size=n).astype(np.int64, copy=False)


def poisson_offsets(rate: float, n: int, seed: int) -> tuple[float, ...]:
    """Absolute send times of a Poisson process (first request at 0), never rescaled."""
    if not rate > 0 or math.isinf(rate):
        raise ValueError(f"request rate must be a positive finite number, got {rate}")
    gaps = np.random.RandomState(seed + 1).exponential(1.0 / rate, size=n)
    return tuple(float(x) for x in np.concatenate([[0.0], np.cumsum(gaps[:-1])])) if n else ()


def build_workload(isl: int, osl: int, conc: int, load: LoadSettings, *,
                   chat_template: bool = False, template_tokens: int = 0,
                   count_tokens: Callable[[str], int] | None = None) -> Workload:
    """The requests of one point: `prompts_per_conc x conc` measured and `warmup_per_conc x
    conc` warmup, deterministic in `load.seed`. `template_tokens` (with `chat_template`) is
    what the template adds to a prompt; the drawn lengths include it. `count_tokens` counts a
    text dataset's prompts (the caller's tokenizer)."""
    template_tokens = template_tokens if chat_template else 0
    if load.dataset.kind in ("sharegpt", "jsonl"):
        return _build(isl, osl, conc, load, chat_template, template_tokens, count_tokens)
    return _drawn(isl, osl, conc, load, chat_template, template_tokens)


# Drawn lengths depend on nothing but the arguments, and a matrix asks for the same
# (ISL, OSL, concurrency) on every server node: the immutable workload is drawn once.
@functools.lru_cache(maxsize=32)
def _drawn(isl: int, osl: int, conc: int, load: LoadSettings, chat_template: bool,
           template_tokens: int) -> Workload:
    return _build(isl, osl, conc, load, chat_template, template_tokens, None)


def _build(isl: int, osl: int, conc: int, load: LoadSettings, chat_template: bool,
           template_tokens: int, count_tokens: Callable[[str], int] | None) -> Workload:
    num = load.prompts_per_conc * conc
    num_warmup = load.warmup_per_conc * conc
    text_dataset = load.dataset.kind in ("sharegpt", "jsonl")
    draw = _draw_texts if text_dataset else _draw_lengths
    requests, texts = draw(isl, osl, num, 0, np.random.RandomState(load.seed), load,
                           template_tokens, count_tokens)
    if load.warmup == "same" or not requests:
        first = requests[0] if requests else PlannedRequest(isl, osl, 0)
        warmup: Requests = (first,) * num_warmup
    else:
        warm_rng = np.random.RandomState(load.seed + _DISTINCT_WARMUP_STREAM)
        warmup, warm_texts = draw(isl, osl, num_warmup, num, warm_rng, load, template_tokens,
                                  count_tokens)
        texts += warm_texts
    if load.dataset.kind == "multiturn" and not math.isinf(load.request_rate):
        raise DatasetError(f"--inferbench-dataset {load.dataset.describe()}: a turn waits for "
                           "the previous one, so multi-turn runs closed loop only (no "
                           "--inferbench-request-rate)")
    offsets = None if math.isinf(load.request_rate) else poisson_offsets(
        load.request_rate, num, load.seed)
    return Workload(requests=requests, warmup=warmup, send_offsets=offsets, concurrency=conc,
                    chat_template=chat_template, template_tokens=template_tokens, load=load,
                    texts=texts)


Drawn = tuple[Requests, tuple[str, ...]]  # requests, texts by text key


def _draw_lengths(isl: int, osl: int, n: int, first_key: int, rng: np.random.RandomState,
                  load: LoadSettings, template_tokens: int,
                  count_tokens: Callable[[str], int] | None) -> Drawn:
    """Random lengths (inputs, then outputs); with a prefix dataset, request i shares the
    first tokens of its prompt with every request of group i mod GROUPS."""
    spec = load.dataset
    body_isl = max(isl - template_tokens, 1)
    if spec.kind == "multiturn":
        body_isl = max(body_isl // spec.turns, 1)  # each turn's new message
    in_lens = sample_lengths(rng, body_isl, load.range_ratio, n)
    out_lens = sample_lengths(rng, osl, load.range_ratio, n)
    if spec.kind == "multiturn":
        return _conversations(in_lens.tolist(), out_lens.tolist(), spec.turns, first_key,
                              template_tokens), ()
    if spec.kind != "prefix":
        return DrawnRequests(in_lens + template_tokens, out_lens, first_key), ()
    return tuple(
        PlannedRequest(a + template_tokens, b, first_key + i, prefix_key=i % spec.groups,
                       prefix_tokens=min(spec.prefix_tokens, a - 1))
        for i, (a, b) in enumerate(zip(in_lens.tolist(), out_lens.tolist(), strict=True))), ()


def _conversations(messages: list[int], replies: list[int], turns: int, first_key: int,
                   template_tokens: int) -> tuple[PlannedRequest, ...]:
    """Request i is turn i mod TURNS of its conversation: the conversation so far (earlier
    messages and replies) plus message i; the template is counted once."""
    requests: list[PlannedRequest] = []
    context = 0
    for i, (message, reply) in enumerate(zip(messages, replies, strict=True)):
        first = i % turns == 0
        context = message if first else context + replies[i - 1] + message
        requests.append(PlannedRequest(context + template_tokens, reply, first_key + i,
                                       follows=None if first else first_key + i - 1))
    return tuple(requests)


def _draw_texts(isl: int, osl: int, n: int, first_key: int, rng: np.random.RandomState,
                load: LoadSettings, template_tokens: int,
                count_tokens: Callable[[str], int] | None) -> Drawn:
    """A text dataset's prompts, shuffled by the seed and taken in order (vLLM samples so),
    drawn again with replacement when the point needs more than the file holds."""
    if count_tokens is None:
        raise DatasetError(f"dataset {load.dataset.describe()}: no token counter given")
    pool = text_prompts(load.dataset)
    order = rng.permutation(len(pool))
    if n > len(pool):
        order = np.concatenate([order, rng.randint(0, len(pool), n - len(pool))])
    requests, texts = [], []
    for i, index in enumerate(order[:n]):
        prompt = pool[int(index)]
        out = prompt.output_tokens
        if out is None:
            out = count_tokens(prompt.output_text) if prompt.output_text else osl
        requests.append(PlannedRequest(count_tokens(prompt.text) + template_tokens, max(out, 1),
                                       first_key + i))
        texts.append(prompt.text)
    return tuple(requests), tuple(texts)


def prompts_workload(texts: tuple[str, ...], lengths: tuple[int, ...], osl: int, conc: int,
                     load: LoadSettings, *, chat_template: bool = False,
                     template_tokens: int = 0) -> Workload:
    """Given prompts, each sent once in order with `max_tokens` = `osl`; `lengths` are their
    token counts without the template. Warmup as `build_workload`'s `same`: the first prompt."""
    if not texts or len(texts) != len(lengths):
        raise ValueError("a prompts workload needs one token count per prompt, and a prompt")
    template_tokens = template_tokens if chat_template else 0
    requests = tuple(PlannedRequest(n + template_tokens, osl, i) for i, n in enumerate(lengths))
    warmup = (requests[0],) * (load.warmup_per_conc * conc)
    offsets = None if math.isinf(load.request_rate) else poisson_offsets(
        load.request_rate, len(requests), load.seed)
    return Workload(requests=requests, warmup=warmup, send_offsets=offsets, concurrency=conc,
                    chat_template=chat_template, template_tokens=template_tokens, load=load,
                    texts=texts)
