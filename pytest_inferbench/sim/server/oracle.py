"""Eval oracle: answers GSM8K questions with a configurable, deterministic accuracy.

`--eval-oracle FILE` loads a GSM8K-style jsonl (``question``, ``answer`` ending ``#### N``).
A prompt whose LAST question matches an entry (few-shot prompts carry earlier solved
questions; the one to answer comes last) is answered with the entry's worked solution
(calculator marks ``<<...>>`` removed), ending ``#### <gold>`` with probability
`accuracy`, otherwise the same text ending in a wrong number. The verdict is drawn once per
question from (seed, question), so the same question always gets the same verdict and a run
over N questions scores ``accuracy`` within its binomial error. Prompts that match nothing get
filler text. Accuracy is independent of every speed setting. A file of GPQA rows loads the
multiple-choice oracle instead (`oracle_choice.py`, whose `load_oracle` picks by the file).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

_CALC_MARK = re.compile(r"<<[^>]*>>")
_KEY_WORDS = 8  # questions are indexed by their first words
_QUESTION_MARK = "Question:"
_ANSWER_MARK = "Answer:"


class OracleError(ValueError):
    """The oracle file cannot be used; the message names the file and line."""


class Oracle(Protocol):
    """What the server asks an oracle: the answer to a prompt it knows (None otherwise)."""

    accuracy: float

    def __len__(self) -> int: ...

    def reply(self, prompt: str) -> str | None: ...



@dataclass(frozen=True)
class OracleEntry:
    question: str  # whitespace-normalized
    solution: str  # worked solution without calculator marks and without the final line
    gold: str


def _normalize(text: str) -> str:
    return " ".join(text.split())


def _parse_answer(answer: str) -> tuple[str, str]:
    head, sep, gold = answer.rpartition("####")
    if not sep or not gold.strip():
        raise ValueError("answer does not end with '#### <number>'")
    return _normalize(_CALC_MARK.sub("", head)), gold.strip()


def wrong_answer(gold: str, key: str) -> str:
    """A number different from `gold`, deterministic per key."""
    digest = hashlib.sha256(key.encode()).digest()
    offset = 1 + digest[0] % 9
    sign = -1 if digest[1] % 2 else 1
    try:
        value = int(gold.replace(",", ""))
    except ValueError:
        return gold.replace(",", "") + "1"
    return str(value + sign * offset)


class EvalOracle:
    """Gold answers by question, and the per-question verdict."""

    def __init__(self, entries: Mapping[str, OracleEntry], accuracy: float, seed: int) -> None:
        if not 0.0 <= accuracy <= 1.0:
            raise OracleError(f"eval accuracy must be within [0, 1], got {accuracy}")
        self._entries = dict(entries)
        self._by_start: dict[tuple[str, ...], list[OracleEntry]] = {}
        for entry in self._entries.values():
            key = tuple(entry.question.split()[:_KEY_WORDS])
            self._by_start.setdefault(key, []).append(entry)
        self._key_lengths = sorted({len(key) for key in self._by_start}, reverse=True)
        self.accuracy = accuracy
        self.seed = seed

    @classmethod
    def from_jsonl(cls, path: Path, accuracy: float, seed: int) -> EvalOracle:
        entries: dict[str, OracleEntry] = {}
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise OracleError(f"{path}: cannot read eval oracle file: {exc.strerror}") from exc
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                question = _normalize(str(item["question"]))
                solution, gold = _parse_answer(str(item["answer"]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise OracleError(
                    f"{path}:{lineno}: not a GSM8K item ({exc}; expected a JSON object with "
                    "'question' and an 'answer' ending '#### <number>')") from exc
            entries[question] = OracleEntry(question, solution, gold)
        if not entries:
            raise OracleError(f"{path}: no GSM8K items")
        return cls(entries, accuracy, seed)

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, prompt: str) -> OracleEntry | None:
        """The entry whose question occurs last in `prompt`, if any."""
        text = _normalize(prompt)
        # Fast path: the "Question: ... Answer:" framing puts the asked question right after the
        # last "Question:", possibly followed by an instruction before "Answer:".
        _, sep, tail = text.rpartition(_QUESTION_MARK)
        if sep:
            entry = self._starting(tail.strip())
            if entry is not None:
                return entry
        best: OracleEntry | None = None
        best_end = -1
        for question, entry in self._entries.items():
            pos = text.rfind(question)
            if pos >= 0 and pos + len(question) > best_end:
                best, best_end = entry, pos + len(question)
        return best

    def _starting(self, text: str) -> OracleEntry | None:
        """The longest question `text` starts with, found through the first-words index."""
        words = tuple(text.split()[:_KEY_WORDS])
        for length in self._key_lengths:
            candidates = self._by_start.get(words[:length], [])
            hits = [e for e in candidates if text.startswith(e.question)]
            if hits:
                return max(hits, key=lambda e: len(e.question))
        return None

    def is_correct(self, entry: OracleEntry) -> bool:
        digest = hashlib.sha256(f"{self.seed}\x00{entry.question}".encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2.0**64
        return draw < self.accuracy

    def reply(self, prompt: str) -> str | None:
        entry = self.match(prompt)
        return self.answer(entry) if entry is not None else None

    def answer(self, entry: OracleEntry) -> str:
        """The worked solution ending in the gold number, or in a wrong one."""
        number = entry.gold if self.is_correct(entry) else wrong_answer(
            entry.gold, f"{self.seed}\x00{entry.question}")
        return f"{entry.solution} #### {number}".strip()
