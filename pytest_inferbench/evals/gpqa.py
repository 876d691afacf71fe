"""GPQA diamond as InferenceX runs it through lm-eval: data, prompt, filter and exact_match.

Prompt, filter and metric follow InferenceX `utils/evals/gpqa_diamond.yaml` (task
`gpqa_diamond_cot_n_shot`) and its `utils.process_docs`:

- data: GPQA's own column layout (`Question`, `Correct Answer`, `Incorrect Answer 1..3`), as the
  data set's CSV (`gpqa_diamond.csv`) or one JSON object per line; the user supplies the file;
- documents: every question asked twice (two repeats), its four answers in an order drawn by
  `random.Random(3407).sample(range(4), 4)` per document, one generator over both repeats in
  file order; the target is the letter the correct answer landed on;
- `doc_to_text`: the question, a blank line, `(A) ..` to `(D) ..` one per line, a blank line and
  "Express your final answer as the corresponding option 'A', 'B', 'C', or 'D'." with the
  trailing newline of the YAML block; zero-shot (the task names no few-shot split), one user
  turn on the chat endpoint;
- generation: the task sets no `generation_kwargs`, so lm-eval stops at its few-shot delimiter
  "\\n\\n" and `run_lm_eval`'s `eos_string=</s>`;
- filter `extract_abcd`: regex `(?i)\\b\\(?([A-D])\\)?\\b`, last match, else "[invalid]";
  `exact_match` with ignore_case against the target letter.
"""

from __future__ import annotations

import csv
import json
import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .gsm8k import INVALID, EvalDataError, FilterScore, mean_and_stderr

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

TASK = "gpqa_diamond_cot_n_shot"
DATA_KEY = "gpqa"  # its name in --inferbench-eval-data and its eval item (`eval-gpqa`)
FILTER = "extract_abcd"
LETTERS = "ABCD"
REPEATS = 2
SHUFFLE_SEED = 3407
PATTERN = re.compile(r"(?i)\b\(?([A-D])\)?\b")
STOP = ("\n\n", "</s>")
COLUMNS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
           "Incorrect Answer 3")
INSTRUCTION = "Express your final answer as the corresponding option 'A', 'B', 'C', or 'D'."


@dataclass(frozen=True)
class GpqaRow:
    question: str
    correct: str
    incorrect: tuple[str, str, str]


@dataclass(frozen=True)
class GpqaDoc:
    """One asked question: the row's answers in this document's order, and the gold letter."""

    question: str
    choices: tuple[str, str, str, str]
    answer: str
    repeat: int


def _row(data: object, where: str) -> GpqaRow:
    if not isinstance(data, dict):
        raise EvalDataError(f"{where}: expected an object with the GPQA columns "
                            f"{', '.join(COLUMNS)}")
    missing = [c for c in COLUMNS if not isinstance(data.get(c), str) or not data[c].strip()]
    if missing:
        raise EvalDataError(f"{where}: missing or empty GPQA column(s) {', '.join(missing)}")
    return GpqaRow(data["Question"], data["Correct Answer"],
                   (data["Incorrect Answer 1"], data["Incorrect Answer 2"],
                    data["Incorrect Answer 3"]))


def load_rows(path: Path) -> list[GpqaRow]:
    """GPQA rows from a `.csv` (the data set's own file) or a JSON-lines file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EvalDataError(f"{path}: cannot read GPQA data: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise EvalDataError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    rows: list[GpqaRow] = []
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines(keepends=True))
        for record in reader:
            rows.append(_row(record, f"{path}:{reader.line_num}"))
    else:
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except (ValueError, RecursionError):
                raise EvalDataError(f"{path}:{number}: not a JSON object (expected the GPQA "
                                    "columns, or a .csv file)") from None
            rows.append(_row(data, f"{path}:{number}"))
    if not rows:
        raise EvalDataError(f"{path}: no GPQA questions")
    return rows


def expand_docs(rows: Sequence[GpqaRow], limit: int | None = None) -> list[GpqaDoc]:
    """The documents lm-eval scores: each row twice with shuffled answers (first `limit`)."""
    rng = random.Random(SHUFFLE_SEED)
    docs: list[GpqaDoc] = []
    for repeat in range(REPEATS):
        for row in rows:
            answers = (row.correct, *row.incorrect)
            order = rng.sample(range(4), 4)  # order[i]: which answer stands at letter i
            choices = (answers[order[0]], answers[order[1]], answers[order[2]],
                       answers[order[3]])
            docs.append(GpqaDoc(row.question, choices, LETTERS[order.index(0)], repeat))
    return docs[:limit] if limit else docs


def doc_to_text(doc: GpqaDoc) -> str:
    options = "\n".join(f"({letter}) {choice}" for letter, choice in zip(LETTERS, doc.choices,
                                                                        strict=True))
    return f"{doc.question}\n\n{options}\n\n{INSTRUCTION}\n"


def build_messages(doc: GpqaDoc) -> list[dict[str, str]]:
    return [{"role": "user", "content": doc_to_text(doc)}]


def extract_letter(response: str) -> str:
    """lm-eval RegexFilter with group_select -1, then take_first."""
    matches = PATTERN.findall(response)
    return str(matches[-1]).strip() if matches else INVALID


def score_responses(docs: Sequence[GpqaDoc], responses: Sequence[str]
                    ) -> tuple[FilterScore, ...]:
    hits = [float(extract_letter(r).lower() == d.answer.lower())
            for d, r in zip(docs, responses, strict=True)]
    return (FilterScore(FILTER, *mean_and_stderr(hits), len(hits)),)
