"""The eval oracle: GSM8K answers with a seeded per-question accuracy, in process and over HTTP."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import httpx
import pytest

from pytest_inferbench.loadgen.tokenizer import count_tokens
from pytest_inferbench.sim.server.oracle import EvalOracle, OracleError

from .conftest import ATOM_MTP_ARGV, FAST, MODEL

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from pytest_inferbench.sim.server.launcher import SimServer

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")  # lm-eval gsm8k strict-match


def gsm8k_items(n: int) -> list[dict[str, str]]:
    """Small GSM8K-format items (question, worked answer ending '#### N')."""
    items = []
    for i in range(n):
        a, b = 3 + i, 5 + 2 * i
        items.append({
            "question": f"Sam has {a} apples and buys {b} more bags with 2 apples each. "
                        f"How many apples does Sam have now? (case {i})",
            "answer": f"The bags hold {b} * 2 = <<{b}*2={2 * b}>>{2 * b} apples.\n"
                      f"Sam has {a} + {2 * b} = <<{a}+{2 * b}={a + 2 * b}>>{a + 2 * b} apples.\n"
                      f"#### {a + 2 * b}"})
    return items


def write_items(path: Path, items: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def few_shot_prompt(items: list[dict[str, str]], asked: int) -> str:
    """lm-eval gsm8k framing: solved shots first, the asked question last."""
    shots = [items[(asked + j + 1) % len(items)] for j in range(3)]
    text = "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)
    return text + f"Question: {items[asked]['question']}\nAnswer:"


def gold(item: dict[str, str]) -> str:
    return item["answer"].rsplit("####", 1)[1].strip()


def test_accuracy_is_per_question_deterministic_and_close_to_the_setting(tmp_path: Path) -> None:
    items = gsm8k_items(400)
    oracle = EvalOracle.from_jsonl(write_items(tmp_path / "test.jsonl", items), 0.8, seed=1)
    verdicts = []
    for index, item in enumerate(items):
        entry = oracle.match(few_shot_prompt(items, index))
        assert entry is not None and entry.gold == gold(item)
        answer = oracle.answer(entry)
        assert answer == oracle.answer(entry)  # same question, same answer
        extracted = STRICT.findall(answer)[-1]
        verdicts.append(extracted == gold(item))
        assert "<<" not in answer
    accuracy = sum(verdicts) / len(verdicts)
    stderr = (0.8 * 0.2 / len(items)) ** 0.5
    assert abs(accuracy - 0.8) < 4 * stderr
    other_seed = EvalOracle.from_jsonl(tmp_path / "test.jsonl", 0.8, seed=2)
    assert [other_seed.is_correct(other_seed.match(few_shot_prompt(items, i)))  # type: ignore[arg-type]
            for i in range(len(items))] != verdicts


def test_question_followed_by_an_instruction_matches(tmp_path: Path) -> None:
    items = gsm8k_items(6)
    oracle = EvalOracle.from_jsonl(write_items(tmp_path / "t.jsonl", items), 1.0, 0)
    prompt = (f"Question: {items[4]['question']}\nEnd your response with the answer on the "
              "last line, formatted as: #### [number]\nAnswer:")
    entry = oracle.match(prompt)
    assert entry is not None and entry.gold == gold(items[4])


def test_unknown_prompts_do_not_match(tmp_path: Path) -> None:
    oracle = EvalOracle.from_jsonl(write_items(tmp_path / "t.jsonl", gsm8k_items(5)), 1.0, 0)
    assert oracle.match("Question: what is the capital of France?\nAnswer:") is None


@pytest.mark.parametrize(("content", "message"), [
    ('{"question": "q"}\n', "t.jsonl:1: not a GSM8K item"),
    ('{"question": "q", "answer": "no marker"}\n', "t.jsonl:1: not a GSM8K item"),
    ("not json\n", "t.jsonl:1:"),
    ("\n", "no GSM8K items"),
])
def test_bad_oracle_file_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    with pytest.raises(OracleError, match=re.escape(message)):
        EvalOracle.from_jsonl(path, 0.9, 0)


def test_server_answers_eval_prompts_from_the_oracle(
        tmp_path: Path, start_server: Callable[..., SimServer]) -> None:
    items = gsm8k_items(40)
    path = write_items(tmp_path / "test.jsonl", items)
    server = start_server(ATOM_MTP_ARGV, (*FAST, "--seed", "3", "--eval-oracle", str(path),
                                          "--eval-accuracy", "0.5"))
    expected = EvalOracle.from_jsonl(path, 0.5, seed=3)
    correct = []
    for index, item in enumerate(items):
        body = {"model": MODEL, "prompt": few_shot_prompt(items, index), "max_tokens": 256,
                "temperature": 0.0, "stop": ["Question:", "</s>", "<|im_end|>"]}
        choice = httpx.post(server.base_url + "/v1/completions", json=body).json()["choices"][0]
        entry = expected.match(body["prompt"])  # type: ignore[arg-type]
        assert entry is not None
        assert choice["text"].strip() == expected.answer(entry)
        assert choice["finish_reason"] == "stop"
        correct.append(STRICT.findall(choice["text"])[-1] == gold(item))
    assert correct == [expected.is_correct(expected.match(few_shot_prompt(items, i)))  # type: ignore[arg-type]
                       for i in range(len(items))]
    assert 0 < sum(correct) < len(items)
    # Chat framing (the question in the last user message) is matched too; other prompts get
    # filler for their whole token budget.
    chat = {"model": MODEL, "max_tokens": 256,
            "messages": [{"role": "user", "content": few_shot_prompt(items, 0)}]}
    reply = httpx.post(server.base_url + "/v1/chat/completions", json=chat).json()
    assert STRICT.search(reply["choices"][0]["message"]["content"])
    filler = httpx.post(server.base_url + "/v1/completions",
                        json={"model": MODEL, "prompt": "tell me a story", "max_tokens": 9})
    assert count_tokens(filler.json()["choices"][0]["text"]) == 9
    assert filler.json()["choices"][0]["finish_reason"] == "length"
