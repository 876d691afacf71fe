"""What a point's prompts are drawn from (`--inferbench-dataset`), read once per file.

- `random` (default, InferenceX's): lengths drawn uniformly (`workload.sample_lengths`), text
  written to length by `loadgen/prompts.py`.
- `sharegpt:PATH`: a ShareGPT-format JSON list of `{"conversations": [{"from": "human",
  "value": ...}, {"from": "gpt", "value": ...}, ...]}`, as vLLM's `--dataset-name sharegpt`
  reads it: the first human turn is the prompt, the reply's length is `max_tokens`; entries
  without both are skipped.
- `jsonl:PATH`: one JSON object a line, `{"prompt": TEXT}` and optionally `"output_tokens": N`
  (otherwise the point's OSL).
- `prefix:GROUPS:TOKENS`: random lengths, but the requests fall into GROUPS groups whose prompts
  start with the same TOKENS tokens (a system prompt or a shared document, for prefix caches).
- `multiturn:TURNS`: conversations of TURNS turns. Each turn's prompt is the conversation so far
  (earlier messages, and stand-in text of the planned length for earlier replies) plus a new
  message of about ISL / TURNS tokens; a turn is sent only after the previous one finished, on
  the same connection (closed loop only).

Text datasets give the prompt text; its token count is the served model's tokenizer's when
there is one, else the simulator's word count, so `sim` and the HTTP client count alike.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

DATASET_KINDS = ("random", "sharegpt", "jsonl", "prefix", "multiturn")


class DatasetError(ValueError):
    """A dataset that cannot be used; the message names the option or the file and line."""


@dataclass(frozen=True)
class DatasetSpec:
    kind: str = "random"
    path: Path | None = None  # sharegpt, jsonl
    groups: int = 0  # prefix: how many shared prefixes
    prefix_tokens: int = 0  # prefix: tokens each group's prompts share
    turns: int = 0  # multiturn: turns per conversation

    def describe(self) -> str:
        if self.kind in ("sharegpt", "jsonl"):
            return f"{self.kind}:{self.path}"
        if self.kind == "prefix":
            return f"prefix:{self.groups}:{self.prefix_tokens}"
        if self.kind == "multiturn":
            return f"multiturn:{self.turns}"
        return self.kind


RANDOM = DatasetSpec()


def parse_dataset(text: str) -> DatasetSpec:
    """`random`, `sharegpt:PATH`, `jsonl:PATH` or `prefix:GROUPS:TOKENS`."""
    kind, _, rest = text.partition(":")
    if kind == "random" and not rest:
        return RANDOM
    if kind in ("sharegpt", "jsonl") and rest:
        path = Path(rest).expanduser()
        if not path.is_file():
            raise DatasetError(f"--inferbench-dataset {text}: {path} is not a file")
        return DatasetSpec(kind, path=path)
    if kind == "prefix":
        groups, _, tokens = rest.partition(":")
        if groups.isdigit() and tokens.isdigit() and int(groups) > 0:
            return DatasetSpec(kind, groups=int(groups), prefix_tokens=int(tokens))
    if kind == "multiturn" and rest.isdigit() and int(rest) >= 2:
        return DatasetSpec(kind, turns=int(rest))
    raise DatasetError(f"--inferbench-dataset {text}: expected random, sharegpt:PATH, "
                       "jsonl:PATH, prefix:GROUPS:TOKENS (e.g. prefix:8:512) or "
                       "multiturn:TURNS (TURNS >= 2)")


@dataclass(frozen=True)
class TextPrompt:
    text: str
    output_tokens: int | None  # None: the point's OSL
    output_text: str | None = None  # ShareGPT's reply, counted into output tokens


def text_prompts(spec: DatasetSpec) -> tuple[TextPrompt, ...]:
    """The prompts of a text dataset, in file order (read once per file and size)."""
    assert spec.path is not None
    stat = spec.path.stat()
    return _read(spec.kind, spec.path.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _read(kind: str, path: Path, _mtime: int, _size: int) -> tuple[TextPrompt, ...]:
    prompts = _sharegpt(path) if kind == "sharegpt" else _jsonl(path)
    if not prompts:
        raise DatasetError(f"{path}: no usable prompts in this {kind} dataset")
    return prompts


def _json(text: str, where: str, what: str) -> object:
    """A JSON value; text that is not JSON, or nested past the parser's depth, is a
    `DatasetError` saying where."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise DatasetError(f"{where}: not {what}: {exc}") from None
    except RecursionError:
        raise DatasetError(f"{where}: not {what}: nested too deeply") from None


def _sharegpt(path: Path) -> tuple[TextPrompt, ...]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path}: not readable: {exc}") from None
    data = _json(_utf8(raw, path, 1), str(path), "a readable ShareGPT JSON file")
    if not isinstance(data, list):
        raise DatasetError(f"{path}: a ShareGPT file is a JSON list of conversations")
    prompts = []
    for entry in data:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, reply = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(reply, dict)):
            continue
        text, answer = first.get("value"), reply.get("value")
        if isinstance(text, str) and text.strip() and isinstance(answer, str) and answer.strip():
            prompts.append(TextPrompt(text, None, answer))
    return tuple(prompts)


def _utf8(raw: bytes, path: Path, first_line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + raw.count(b"\n", 0, exc.start)
        raise DatasetError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x})"
                           ) from None


def _jsonl(path: Path) -> tuple[TextPrompt, ...]:
    prompts = []
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path}: not readable: {exc}") from None
    # JSON Lines ends a line at \n only: str.splitlines() would also split at U+2028 and the
    # other Unicode line breaks, which JSON allows unescaped inside a string.
    for number, line_bytes in enumerate(raw.split(b"\n"), 1):
        line = _utf8(line_bytes, path, number)
        if not line.strip():
            continue
        row = _json(line, f"{path}:{number}", "JSON")
        text = row.get("prompt") if isinstance(row, dict) else None
        out = row.get("output_tokens") if isinstance(row, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise DatasetError(f'{path}:{number}: expected {{"prompt": TEXT}} with a text')
        if out is not None and (isinstance(out, bool) or not isinstance(out, int) or out < 1):
            raise DatasetError(f"{path}:{number}: output_tokens must be a positive integer")
        prompts.append(TextPrompt(text, out))
    return tuple(prompts)
