"""Eval oracle for multiple-choice questions (GPQA): answers with a letter, right with a
configurable, deterministic accuracy.

`--eval-oracle FILE` with GPQA's columns (`Question`, `Correct Answer`, `Incorrect Answer 1..3`;
the data set's `.csv`, or one JSON object per line) loads this oracle. A prompt that holds a
known question followed by options `(A) ..` to `(D) ..` is answered with the letter of the
option whose text is the correct answer, with probability `accuracy`, else with another
letter. The letter is found in the prompt, so however the eval shuffled the options the
oracle stays right. The verdict is drawn once per (seed, question, correct letter): the same
document always gets the same verdict, and a run over N documents scores `accuracy` within
its binomial error.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from typing import TYPE_CHECKING

from .oracle import EvalOracle, Oracle, OracleError

if TYPE_CHECKING:
    from pathlib import Path

QUESTION = "Question"
CORRECT = "Correct Answer"
LETTERS = "ABCD"
_OPTION = re.compile(r"\(([A-D])\) ")


def _normalize(text: str) -> str:
    return " ".join(text.split())


def load_oracle(path: Path, accuracy: float, seed: int) -> Oracle:
    """The GSM8K oracle, or the multiple-choice one for a file of GPQA rows."""
    if is_choice_file(path):
        return ChoiceOracle.from_file(path, accuracy, seed)
    return EvalOracle.from_jsonl(path, accuracy, seed)


def is_choice_file(path: Path) -> bool:
    """Whether `path` holds GPQA-style rows (a .csv, or jsonl whose first object has the
    GPQA columns) rather than GSM8K items."""
    if path.suffix.lower() == ".csv":
        return True
    try:
        with path.open(encoding="utf-8") as handle:
            first = next((line for line in handle if line.strip()), "")
        data = json.loads(first)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and QUESTION in data and CORRECT in data


class ChoiceOracle:
    """Correct answers by question, and the per-document verdict."""

    def __init__(self, correct: dict[str, str], accuracy: float, seed: int) -> None:
        if not 0.0 <= accuracy <= 1.0:
            raise OracleError(f"eval accuracy must be within [0, 1], got {accuracy}")
        self._correct = dict(correct)  # normalized question -> normalized correct answer
        self.accuracy = accuracy
        self.seed = seed

    @classmethod
    def from_file(cls, path: Path, accuracy: float, seed: int) -> ChoiceOracle:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise OracleError(f"{path}: cannot read eval oracle file: {exc}") from exc
        rows: list[tuple[str, object]] = []
        if path.suffix.lower() == ".csv":
            reader = csv.DictReader(text.splitlines(keepends=True))
            rows = [(f"{path}:{reader.line_num}", row) for row in reader]
        else:
            for number, line in enumerate(text.splitlines(), start=1):
                if line.strip():
                    try:
                        rows.append((f"{path}:{number}", json.loads(line)))
                    except (ValueError, RecursionError):
                        rows.append((f"{path}:{number}", None))
        correct: dict[str, str] = {}
        for where, row in rows:
            if not (isinstance(row, dict) and isinstance(row.get(QUESTION), str)
                    and isinstance(row.get(CORRECT), str)):
                raise OracleError(f"{where}: not a GPQA row (expected '{QUESTION}' and "
                                  f"'{CORRECT}')")
            correct[_normalize(row[QUESTION])] = _normalize(row[CORRECT])
        if not correct:
            raise OracleError(f"{path}: no GPQA questions")
        return cls(correct, accuracy, seed)

    def __len__(self) -> int:
        return len(self._correct)

    def reply(self, prompt: str) -> str | None:
        """The letter answer to the known question in `prompt`; None when there is none."""
        text = _normalize(prompt)
        found = [(q, text.rfind(q)) for q in self._correct if q in text]
        if not found:
            return None
        question, start = max(found, key=lambda hit: hit[1] + len(hit[0]))
        options = self._options(text[start + len(question):])
        right = self._correct[question]
        letter = next((k for k, v in options.items() if v == right), None)
        if letter is None:
            return None
        digest = hashlib.sha256(f"{self.seed}\x00{question}\x00{letter}".encode()).digest()
        if int.from_bytes(digest[:8], "big") / 2.0**64 >= self.accuracy:
            others = [k for k in LETTERS if k != letter]
            letter = others[digest[8] % len(others)]
        return f"The correct option is ({letter})."

    @staticmethod
    def _options(text: str) -> dict[str, str]:
        """{letter: option text} of the `(A) ..` to `(D) ..` list after the question."""
        marks = list(_OPTION.finditer(text))
        out: dict[str, str] = {}
        for n, mark in enumerate(marks):
            end = marks[n + 1].start() if n + 1 < len(marks) else len(text)
            body = text[mark.end():end].strip()
            if n + 1 == len(marks):
                body = body.partition(" Express your final answer")[0].strip()
            out.setdefault(mark.group(1), body)
        return out
