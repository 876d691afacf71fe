"""GSM8K as InferenceX runs it through lm-eval: data, 5-shot prompts, filters and exact_match.

Prompt, filters and metric follow InferenceX `utils/evals/gsm8k.yaml` (inferencex-formats.md
§5.2), a modified lm-eval gsm8k task:

- `doc_to_text`: "Question: {q}\\nEnd your response with the answer on the last line, formatted
  as: #### [number]\\nAnswer:"; shots are `doc_to_text + " " + answer`, joined by a blank line
  (lm-eval's target and few-shot delimiters), and the shots and the question go to the chat
  endpoint as one user turn, as lm-eval sends them with `--apply_chat_template` and without
  `--fewshot_as_multiturn` (InferenceX's `run_lm_eval`);
- few-shot sampling: lm-eval's default sampler, `random.Random(1234).sample(train, 5)` drawn
  afresh for every scored question in order (`fewshot_split: train`, seed 1234 is lm-eval's
  default `fewshot_random_seed`), so each question gets the shots lm-eval would give it;
- `strict-match`: regex `#### (\\-?[0-9\\.\\,]+)`, last match; `flexible-extract`: regex
  `(-?[$0-9.,]{2,})|(-?[0-9]+)`, last match; no match -> "[invalid]" (lm-eval's fallback);
- `exact_match` with ignore_case and regexes_to_ignore `[",", "\\$", "(?s).*#### ", "\\.$"]`,
  applied to prediction and reference alike; stderr = sample std (ddof 1) / sqrt(n).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

TASK = "gsm8k"
NUM_FEWSHOT = 5
FEWSHOT_SEED = 1234  # lm-eval's default fewshot_random_seed
METRIC = "exact_match"
FILTERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("strict-match", re.compile(r"#### (\-?[0-9\.\,]+)")),
    ("flexible-extract", re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")),
)
REGEXES_TO_IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")
INVALID = "[invalid]"
# InferenceX stops chat generations at these (evals always run on the chat endpoint).
STOP_CHAT = ("</s>", "<|im_end|>")


class EvalDataError(Exception):
    """The GSM8K file cannot be used; the message names file and line."""


@dataclass(frozen=True)
class GsmItem:
    question: str
    answer: str  # worked solution ending "#### <number>" (also the exact_match reference)


def load_items(path: Path) -> list[GsmItem]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EvalDataError(f"{path}: cannot read GSM8K data: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise EvalDataError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    items: list[GsmItem] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            item = GsmItem(str(data["question"]), str(data["answer"]))
        except (ValueError, KeyError, TypeError, RecursionError):
            raise EvalDataError(
                f"{path}:{number}: expected a JSON object with 'question' and 'answer'"
            ) from None
        if "####" not in item.answer:
            raise EvalDataError(f"{path}:{number}: answer does not end with '#### <number>'")
        items.append(item)
    if not items:
        raise EvalDataError(f"{path}: no GSM8K items")
    return items


def split_shots(test_path: Path, limit: int | None = None) -> tuple[list[GsmItem], list[GsmItem]]:
    """(shot pool, scored items): the pool is train.jsonl beside the test file (lm-eval's
    `fewshot_split: train`), else the first five test items, which are then not scored."""
    items = load_items(test_path)
    train = test_path.with_name("train.jsonl")
    if train.is_file() and train.resolve() != test_path.resolve():
        shots = load_items(train)
        scored = items
    else:
        shots, scored = items[:NUM_FEWSHOT], items[NUM_FEWSHOT:]
    if not scored:
        raise EvalDataError(f"{test_path}: no items left to score after the {NUM_FEWSHOT} shots")
    return shots, scored[:limit] if limit else scored


def doc_to_text(question: str) -> str:
    return (
        f"Question: {question}\nEnd your response with the answer on the last line, "
        "formatted as: #### [number]\nAnswer:"
    )


def build_prompt(shots: Sequence[GsmItem], question: str) -> str:
    examples = [f"{doc_to_text(s.question)} {s.answer}" for s in shots]
    return "\n\n".join([*examples, doc_to_text(question)])


def sample_shots(pool: Sequence[GsmItem], count: int) -> list[list[GsmItem]]:
    """The shots of each of `count` scored questions, in order, as lm-eval's default sampler
    draws them (`pool` is the few-shot split)."""
    rng = random.Random(FEWSHOT_SEED)
    n = min(NUM_FEWSHOT, len(pool))
    return [rng.sample(list(pool), n) for _ in range(count)]


def build_messages(shots: Sequence[GsmItem], question: str) -> list[dict[str, str]]:
    """Chat form, as lm-eval sends it with --apply_chat_template (no --fewshot_as_multiturn):
    the shots and the question as one user turn."""
    return [{"role": "user", "content": build_prompt(shots, question)}]


def extract(response: str, pattern: re.Pattern[str]) -> str:
    """lm-eval RegexFilter with group_select -1, then take_first."""
    matches = pattern.findall(response)
    if not matches:
        return INVALID
    match = matches[-1]
    if isinstance(match, tuple):
        found = [m for m in match if m]
        match = found[0] if found else INVALID
    return str(match).strip()


def _normalize(text: str) -> str:
    for regex in REGEXES_TO_IGNORE:
        text = re.sub(regex, "", text)
    return text.lower()


def exact_match(prediction: str, reference: str) -> bool:
    return _normalize(prediction) == _normalize(reference)


@dataclass(frozen=True)
class FilterScore:
    name: str
    score: float
    stderr: float
    n: int


def score_responses(items: Sequence[GsmItem], responses: Sequence[str]) -> tuple[FilterScore, ...]:
    scores: list[FilterScore] = []
    for name, pattern in FILTERS:
        hits = [
            float(exact_match(extract(r, pattern), item.answer))
            for item, r in zip(items, responses, strict=True)
        ]
        scores.append(FilterScore(name, *mean_and_stderr(hits), len(hits)))
    return tuple(scores)


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    if n == 0:
        return 0.0, 0.0
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance) / math.sqrt(n)
