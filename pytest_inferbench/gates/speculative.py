"""Speculative decoding as the launch spec configures it, and the golden acceptance lengths.

The recipe only says `spec-decoding: mtp`; the method, the draft length k and any forced
(synthetic) acceptance live in the server argv/env, per engine (inferencex-formats.md §6):
ATOM `--method eagle3 --num-speculative-tokens 3 [--spec-decode-acceptance-length AL |
--spec-decode-acceptance-rate R]`, vLLM `--speculative-config '{"method":..,
"num_speculative_tokens":k, "synthetic_acceptance_length":AL}'`, SGLang
`--speculative-algorithm EAGLE3 --speculative-num-steps k` with `SGLANG_SIMULATE_ACC_LEN=AL`,
TensorRT-LLM `TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS=AL-1`.

Golden ALs: `benchmarks/golden_al/<model-prefix>_<method>.yaml`, InferenceX's
`golden_al_distribution` format: `<model>: {thinking_on: {k: AL}, thinking_off: {k: AL}}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from ..launch import ServerSpec
    from ..recipe import ServerConfig

THINKING_ON = "thinking_on"
THINKING_OFF = "thinking_off"


@dataclass(frozen=True)
class SpecDecoding:
    method: str  # eagle3, mtp, nextn, draft_model, ...
    num_tokens: int | None  # k
    synthetic_al: float | None  # forced acceptance length, when the launch spec sets one
    synthetic_source: str  # which knob forced it, for messages
    thinking: str  # thinking_on / thinking_off


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last `--name value` or `--name=value` in argv."""
    found: str | None = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif arg.startswith(name + "="):
                found = arg[len(name) + 1 :]
    return found


def _json_object(text: str | None) -> dict[str, object]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def speculative_decoding(server: ServerConfig, spec: ServerSpec | None) -> SpecDecoding | None:
    """What the server runs, or None when it does not speculate."""
    argv: tuple[str, ...] = spec.argv if spec else ()
    env = spec.env_dict if spec else {}
    vllm_config = _json_object(flag_value(argv, "--speculative-config"))
    method = (
        flag_value(argv, "--method")
        or (str(vllm_config["method"]) if "method" in vllm_config else None)
        or flag_value(argv, "--speculative-algorithm")
    )
    if method is None and not server.speculative:
        return None
    method = (method or server.spec_decoding).lower()
    k_text = (
        flag_value(argv, "--num-speculative-tokens")
        or (
            str(vllm_config["num_speculative_tokens"])
            if "num_speculative_tokens" in vllm_config
            else None
        )
        or flag_value(argv, "--speculative-num-steps")
    )
    k = int(k_text) if k_text and k_text.isdigit() else None
    synthetic, source = _synthetic_al(argv, env, vllm_config, k)
    return SpecDecoding(method, k, synthetic, source, _thinking_mode(argv))


def _synthetic_al(
    argv: Sequence[str], env: dict[str, str], vllm_config: dict[str, object], k: int | None
) -> tuple[float | None, str]:
    atom_al = _number(flag_value(argv, "--spec-decode-acceptance-length"))
    if atom_al is not None:
        return atom_al, "--spec-decode-acceptance-length"
    atom_rate = _number(flag_value(argv, "--spec-decode-acceptance-rate"))
    if atom_rate is not None and k is not None:
        return 1.0 + atom_rate * k, "--spec-decode-acceptance-rate"
    vllm_al = _number(vllm_config.get("synthetic_acceptance_length"))
    if vllm_al is not None:
        return vllm_al, "synthetic_acceptance_length in --speculative-config"
    sglang_al = _number(env.get("SGLANG_SIMULATE_ACC_LEN"))
    if sglang_al is not None:
        return sglang_al, "SGLANG_SIMULATE_ACC_LEN"
    trt_accepted = _number(env.get("TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS"))
    if trt_accepted is not None:
        return trt_accepted + 1.0, "TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS"
    return None, ""


def _thinking_mode(argv: Sequence[str]) -> str:
    """Reasoning models think unless the server's default chat-template kwargs turn it off."""
    kwargs = _json_object(
        flag_value(argv, "--default-chat-template-kwargs", "--chat-template-kwargs")
    )
    thinking = kwargs.get("enable_thinking", kwargs.get("thinking", True))
    return THINKING_OFF if thinking is False else THINKING_ON


@dataclass(frozen=True)
class GoldenAL:
    """Golden acceptance lengths keyed by (model prefix, method, thinking mode, k)."""

    table: tuple[tuple[tuple[str, str, str, int], float], ...] = ()
    sources: tuple[tuple[tuple[str, str], str], ...] = ()  # (prefix, method) -> file

    def lookup(self, model_prefix: str, method: str, thinking: str, k: int | None) -> float | None:
        if k is None:
            return None
        return dict(self.table).get((model_prefix, method, thinking, k))

    def source(self, model_prefix: str, method: str) -> str | None:
        return dict(self.sources).get((model_prefix, method))


class GoldenALError(Exception):
    """A golden AL file is malformed; the message names the file."""


def load_golden_al(directory: Path) -> GoldenAL:
    """Read every `<model-prefix>_<method>.yaml` in `directory` (missing directory: empty)."""
    if not directory.is_dir():
        return GoldenAL()
    table: dict[tuple[str, str, str, int], float] = {}
    sources: dict[tuple[str, str], str] = {}
    for path in sorted(directory.glob("*.yaml")):
        prefix, _, method = path.stem.partition("_")
        if not method:
            raise GoldenALError(f"{path}: name must be <model-prefix>_<method>.yaml")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise GoldenALError(f"{path}: invalid YAML: {exc}") from None
        if not isinstance(data, dict) or len(data) != 1:
            raise GoldenALError(f"{path}: expected one top-level model key")
        modes = next(iter(data.values()))
        if not isinstance(modes, dict):
            raise GoldenALError(f"{path}: expected thinking_on/thinking_off mappings")
        for mode, by_k in modes.items():
            if mode not in (THINKING_ON, THINKING_OFF) or not isinstance(by_k, dict):
                raise GoldenALError(
                    f"{path}: {mode!r} must be thinking_on or thinking_off "
                    "mapping k to an acceptance length"
                )
            for k, al in by_k.items():
                if not isinstance(k, int) or _number(al) is None:
                    raise GoldenALError(f"{path}: {mode}.{k}: expected integer k -> number")
                table[(prefix, method.lower(), mode, k)] = float(al)
        sources[(prefix, method.lower())] = path.name
    return GoldenAL(tuple(table.items()), tuple(sources.items()))
