"""Speculative decoding as a server's launch argv and environment configure it.

The one reader of the speculative-decoding flags: the simulator builds its engine from the
description and the gates compare the measured acceptance length against the golden one for
it, so both always agree on the method, the draft length k, the draft model, the thinking mode
and any forced (synthetic) acceptance.

Each framework family spells it its own way (inferencex-formats.md §6); one reader per family,
the flags and forcing knobs each reads listed in its registry entry (`speculative`):

- ATOM: `--method eagle3 --draft-model M --num-speculative-tokens k
  [--spec-decode-acceptance-length AL | --spec-decode-acceptance-rate R]`
- vLLM: `--speculative-config '{"method": .., "model": .., "num_speculative_tokens": k,
  "rejection_sample_method": "synthetic",
  "synthetic_acceptance_length": AL | "synthetic_acceptance_rates": [..]}'`
- SGLang: `--speculative-algorithm EAGLE3 --speculative-draft-model-path M
  (--speculative-num-steps k | --speculative-num-draft-tokens k+1)`, `SGLANG_SIMULATE_ACC_LEN=AL`
- TensorRT-LLM: the extra-options YAML's `speculative_config` (`decoding_type` MTP with
  `num_nextn_predict_layers` or `max_draft_len`, Eagle / Eagle3 with `max_draft_len` and
  `speculative_model_dir`), `TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS=AL-1`
- the simulator: `--sim-accepted-distribution` / `INFERBENCH_SIM_ACCEPTED_DISTRIBUTION`

Prompt lookup (`ngram`: vLLM's method, SGLang's NGRAM, TensorRT-LLM's NGram) drafts by
matching the prompt's own text, with no trained head: a method of its own, whose acceptance
does not hang on chat framing (`SpeculativeDecoding.needs_chat_template`). vLLM reads a config
without `method` as ngram when it names the `[ngram]` model or sets `prompt_lookup_*`; so does
this reader.

Flags are matched with `_` and `-` alike and as `--flag value` or `--flag=value`; the last one
wins, as in argparse. The thinking mode is on (reasoning models think) unless the server's
default chat-template kwargs turn it off.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from . import registry

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "THINKING_OFF",
    "THINKING_ON",
    "SpecDecodeArgvError",
    "SpeculativeDecoding",
    "read_speculative_decoding",
    "read_thinking",
    "value_flags",
]

T = TypeVar("T")

THINKING_ON = "thinking_on"
THINKING_OFF = "thinking_off"

# Methods that draft from the prompt's text rather than a trained head or draft model.
PROMPT_LOOKUP_METHODS = frozenset({"ngram"})

SIM_FLAGS = ("sim-accepted-distribution",)
THINKING_FLAGS = ("default-chat-template-kwargs", "chat-template-kwargs")


def value_flags() -> frozenset[str]:
    """Every value-taking flag read here (canonical spelling), so an argv parser can skip them:
    each framework's speculative flags (its registry entry's `speculative.flags`), the
    simulator's own and the thinking mode's."""
    own = (f for framework in registry.frameworks() for f in framework.speculative_flags)
    return frozenset((*own, *SIM_FLAGS, *THINKING_FLAGS))


class SpecDecodeArgvError(ValueError):
    """A speculative-decoding flag whose value cannot be read; the message names the flag."""


@dataclass(frozen=True)
class SpeculativeDecoding:
    """What the launch spec asks the server to speculate, exactly as it says it."""

    method: str  # lower case: eagle3, eagle, mtp, nextn, draft_model, ngram, ...
    num_tokens: int | None  # k, the draft tokens per verify step (None: the argv does not say)
    draft_model: str | None  # None: the target's own head (MTP) or not given
    thinking: bool  # the golden AL's thinking_on curve (False: thinking_off)
    acceptance_length: float | None = None  # forced AL (1 + accepted / verify steps)
    acceptance_rate: float | None = None  # forced per-draft acceptance rate
    position_rates: tuple[float, ...] | None = None  # forced P(draft position i accepted)
    accepted_distribution: tuple[float, ...] | None = None  # forced P(accepted = 0..k)
    forced_by: str = ""  # the knob(s) that force acceptance, for messages

    @property
    def thinking_mode(self) -> str:
        return THINKING_ON if self.thinking else THINKING_OFF

    @property
    def needs_chat_template(self) -> bool:
        """A trained head or draft model accepts well only on chat-framed prompts (InferenceX's
        speculative scripts all pass --use-chat-template); prompt lookup drafts from whatever
        text the prompt holds."""
        return self.method not in PROMPT_LOOKUP_METHODS

    @property
    def forced_acceptance_length(self) -> float | None:
        """The acceptance length the forcing knob implies (None when acceptance is natural)."""
        if self.acceptance_length is not None:
            return self.acceptance_length
        if self.acceptance_rate is not None and self.num_tokens is not None:
            return 1.0 + self.acceptance_rate * self.num_tokens
        if self.accepted_distribution is not None:
            return 1.0 + sum(i * p for i, p in enumerate(self.accepted_distribution))
        if self.position_rates is not None:
            return 1.0 + sum(self.position_rates)
        return None


@dataclass(frozen=True)
class _Reading:
    """What one framework family's flags say (None: that family's flags do not say it)."""

    method: str | None = None
    num_tokens: int | None = None
    draft_model: str | None = None
    acceptance_length: float | None = None
    acceptance_rate: float | None = None
    position_rates: tuple[float, ...] | None = None
    accepted_distribution: tuple[float, ...] | None = None
    forced_by: tuple[str, ...] = ()


def flag_values(argv: Sequence[str], names: frozenset[str] | None = None) -> dict[str, str]:
    """`--name value` / `--name=value` for the canonical `names` (default: `value_flags()`);
    the last one wins."""
    names = value_flags() if names is None else names
    found: dict[str, str] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if not word.startswith("--"):
            continue
        name, eq, inline = word[2:].partition("=")
        name = name.replace("_", "-")
        if name not in names:
            continue
        if eq:
            found[name] = inline
        elif i < len(argv):
            found[name] = argv[i]
            i += 1
    return found


def read_speculative_decoding(argv: Sequence[str], env: Mapping[str, str] | None = None,
                              trt_options: Mapping[str, object] | None = None,
                              ) -> SpeculativeDecoding | None:
    """The speculative decoding the argv/env configure, or None when the server does not speculate.

    Raises `SpecDecodeArgvError` for a value no server would accept (a non-JSON
    `--speculative-config`, a non-integer k, a non-numeric forced acceptance).
    """
    env = env or {}
    flags = flag_values(argv)
    readings = [reading for name in readers()
                for reading in READERS[name](flags, env, trt_options or {})]
    readings.append(_sim(flags, env, _first(r.num_tokens for r in readings)))

    method = _first(r.method for r in readings)
    if method is None:
        return None
    return SpeculativeDecoding(
        method=method.lower(), num_tokens=_first(r.num_tokens for r in readings),
        draft_model=_first(r.draft_model for r in readings), thinking=_thinking(flags),
        acceptance_length=_first(r.acceptance_length for r in readings),
        acceptance_rate=_first(r.acceptance_rate for r in readings),
        position_rates=_first(r.position_rates for r in readings),
        accepted_distribution=_first(r.accepted_distribution for r in readings),
        forced_by=", ".join(knob for r in readings for knob in r.forced_by))


def readers() -> tuple[str, ...]:
    """The family readers the frameworks name (their entries' `speculative.reader`), once
    each, in the registry's order: where two families' knobs say the same thing, the first
    one's counts."""
    named = (f.speculative_reader for f in registry.frameworks() if f.speculative_reader)
    found = tuple(dict.fromkeys(named))
    unknown = [name for name in found if name not in READERS]
    if unknown:
        # The registry cannot check the names itself: this module asks it, not the reverse.
        raise registry.FrameworkError(
            f"speculative.reader {unknown[0]!r} unknown; known: {', '.join(sorted(READERS))}")
    return found


def _first(values: Iterable[T | None]) -> T | None:
    return next((v for v in values if v is not None), None)


def _atom(flags: Mapping[str, str]) -> _Reading:
    length = _float(flags, "spec-decode-acceptance-length")
    rate = _float(flags, "spec-decode-acceptance-rate")
    return _Reading(
        method=flags.get("method"), num_tokens=_int(flags, "num-speculative-tokens"),
        draft_model=flags.get("draft-model"), acceptance_length=length, acceptance_rate=rate,
        forced_by=tuple(f"--spec-decode-acceptance-{what}"
                        for what, value in (("length", length), ("rate", rate))
                        if value is not None))


def _vllm(flags: Mapping[str, str]) -> _Reading:
    if "speculative-config" not in flags:
        return _Reading()
    try:
        config = json.loads(flags["speculative-config"])
    except json.JSONDecodeError as exc:
        raise SpecDecodeArgvError(f"--speculative-config is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise SpecDecodeArgvError("--speculative-config must be a JSON object")
    where = "in --speculative-config"
    k = config.get("num_speculative_tokens")
    length = config.get("synthetic_acceptance_length")
    rates = config.get("synthetic_acceptance_rates")
    if (length is not None or rates is not None) and \
            config.get("rejection_sample_method") != "synthetic":
        # vLLM refuses the synthetic knobs under real verification (InferenceX's scripts say
        # so, and switch to "block" for their accuracy runs): the simulated server too.
        raise SpecDecodeArgvError(
            f"synthetic_acceptance_{'length' if length is not None else 'rates'} {where} "
            "needs \"rejection_sample_method\": \"synthetic\" (vLLM rejects it otherwise)")
    model = str(config["model"]) if config.get("model") else None
    method = str(config["method"]) if config.get("method") else None
    if method is None and (model in ("[ngram]", "ngram")
                           or any(key.startswith("prompt_lookup_") for key in config)):
        method, model = "ngram", None  # vLLM's own reading of a config without a method
    return _Reading(
        method=method,
        num_tokens=_as_int(k, f"num_speculative_tokens {where}") if k is not None else None,
        draft_model=model,
        acceptance_length=(_as_float(length, f"synthetic_acceptance_length {where}")
                           if length is not None else None),
        position_rates=(_as_floats(rates, f"synthetic_acceptance_rates {where}")
                        if rates is not None else None),
        forced_by=tuple(f"{name} {where}" for name, value in (
            ("synthetic_acceptance_length", length), ("synthetic_acceptance_rates", rates))
            if value is not None))


def _sglang(flags: Mapping[str, str], env: Mapping[str, str]) -> _Reading:
    k = _int(flags, "speculative-num-steps")
    verified = _int(flags, "speculative-num-draft-tokens")
    if k is None and verified is not None:
        k = verified - 1  # chain drafting: the draft tokens plus the one verified token
    length = (_as_float(env["SGLANG_SIMULATE_ACC_LEN"], "SGLANG_SIMULATE_ACC_LEN")
              if "SGLANG_SIMULATE_ACC_LEN" in env else None)
    return _Reading(
        method=flags.get("speculative-algorithm"), num_tokens=k,
        draft_model=flags.get("speculative-draft-model-path"), acceptance_length=length,
        forced_by=("SGLANG_SIMULATE_ACC_LEN",) if length is not None else ())


def _trtllm(env: Mapping[str, str]) -> _Reading:
    name = "TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS"
    if name not in env:
        return _Reading()
    return _Reading(acceptance_length=_as_float(env[name], name) + 1.0, forced_by=(name,))


def _trtllm_options(options: Mapping[str, object]) -> _Reading:
    """TensorRT-LLM `speculative_config` from the extra-options YAML (sim/trtllm.py reads it)."""
    spec = options.get("speculative_config")
    if not isinstance(spec, dict) or not spec.get("decoding_type"):
        return _Reading()
    kind = str(spec["decoding_type"]).lower()
    k = spec.get("num_nextn_predict_layers", spec.get("max_draft_len"))
    draft = spec.get("speculative_model_dir")
    return _Reading(method=kind, num_tokens=int(k) if k is not None else None,
                    draft_model=str(draft) if draft else None)


def _trtllm_family(flags: Mapping[str, str], env: Mapping[str, str],
                   options: Mapping[str, object]) -> tuple[_Reading, ...]:
    return _trtllm(env), _trtllm_options(options)


_Reader = Callable[[Mapping[str, str], Mapping[str, str], Mapping[str, object]],
                   tuple[_Reading, ...]]
# Each family's reader by the name a registry entry gives as `speculative.reader`.
READERS: dict[str, _Reader] = {
    "atom": lambda flags, env, options: (_atom(flags),),
    "vllm": lambda flags, env, options: (_vllm(flags),),
    "sglang": lambda flags, env, options: (_sglang(flags, env),),
    "trtllm": _trtllm_family,
}


def _sim(flags: Mapping[str, str], env: Mapping[str, str], k: int | None) -> _Reading:
    """The simulator's own knob: an explicit P(accepted = 0..k), as a list or {"0": p0, ..}."""
    raw = flags.get("sim-accepted-distribution") or env.get("INFERBENCH_SIM_ACCEPTED_DISTRIBUTION")
    if not raw:
        return _Reading()
    message = (f"accepted-count distribution {raw!r}: expected a JSON list "
               "or {\"0\": p0, ...}")
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        raise SpecDecodeArgvError(message) from None
    if isinstance(parsed, dict):
        try:
            by_count = {int(key): value for key, value in parsed.items()}
        except ValueError:
            raise SpecDecodeArgvError(message) from None
        size = max(max(by_count, default=-1), k if k is not None else -1) + 1
        parsed = [by_count.get(i, 0.0) for i in range(size)]
    return _Reading(accepted_distribution=_as_floats(parsed, message),
                    forced_by=("accepted-count distribution",))


def read_thinking(argv: Sequence[str]) -> bool:
    """The thinking mode alone (for a server that does not speculate, or a recipe that says so)."""
    return _thinking(flag_values(argv, frozenset(THINKING_FLAGS)))


def _thinking(flags: Mapping[str, str]) -> bool:
    """Reasoning models think unless the server's default chat-template kwargs turn it off."""
    text = flags.get("default-chat-template-kwargs") or flags.get("chat-template-kwargs")
    try:
        kwargs = json.loads(text) if text else {}
    except json.JSONDecodeError:
        kwargs = {}  # the server rejects it; the thinking mode stays the model's default
    if not isinstance(kwargs, dict):
        return True
    return kwargs.get("enable_thinking", kwargs.get("thinking", True)) is not False


def _int(flags: Mapping[str, str], name: str) -> int | None:
    return _as_int(flags[name], f"--{name}") if name in flags else None


def _float(flags: Mapping[str, str], name: str) -> float | None:
    return _as_float(flags[name], f"--{name}") if name in flags else None


def _as_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SpecDecodeArgvError(f"{what}: {value!r} is not an integer")
    try:
        return int(value)
    except ValueError:
        raise SpecDecodeArgvError(f"{what}: {value!r} is not an integer") from None


def _as_float(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SpecDecodeArgvError(f"{what}: {value!r} is not a number")
    try:
        return float(value)
    except ValueError:
        raise SpecDecodeArgvError(f"{what}: {value!r} is not a number") from None


def _as_floats(value: object, what: str) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise SpecDecodeArgvError(f"{what}: expected a list of numbers")
    return tuple(_as_float(x, what) for x in value)
