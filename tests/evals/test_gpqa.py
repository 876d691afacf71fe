"""GPQA diamond as InferenceX's gpqa_diamond.yaml scores it, the per-task eval data option, and
the simulator's multiple-choice oracle answering the prompts the eval sends."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_inferbench.evals import gpqa
from pytest_inferbench.evals.gsm8k import INVALID, EvalDataError
from pytest_inferbench.options.eval_data import parse_eval_data
from pytest_inferbench.sim.server.oracle_choice import ChoiceOracle, load_oracle
from pytest_inferbench.testing.recipes import master_entry

SAMPLE = Path(__file__).parent / "data" / "gpqa_sample.csv"


def test_every_question_is_asked_twice_with_the_gold_letter_on_the_correct_answer() -> None:
    rows = gpqa.load_rows(SAMPLE)
    docs = gpqa.expand_docs(rows)
    assert len(docs) == gpqa.REPEATS * len(rows)
    for index, doc in enumerate(docs):
        row = rows[index % len(rows)]
        assert doc.question == row.question
        assert sorted(doc.choices) == sorted((row.correct, *row.incorrect))
        assert doc.choices[gpqa.LETTERS.index(doc.answer)] == row.correct
    # The two repeats shuffle independently: the data is not asked twice in one order.
    first, second = docs[:len(rows)], docs[len(rows):]
    assert [d.choices for d in first] != [d.choices for d in second]
    # The same file always gives the same documents (lm-eval's seeded shuffle).
    assert gpqa.expand_docs(rows) == docs
    assert gpqa.expand_docs(rows, limit=3) == docs[:3]


def test_prompt_lists_the_options_and_asks_for_a_letter() -> None:
    doc = gpqa.expand_docs(gpqa.load_rows(SAMPLE))[0]
    text = gpqa.doc_to_text(doc)
    assert text.startswith(doc.question + "\n\n(A) ")
    for letter, choice in zip(gpqa.LETTERS, doc.choices, strict=True):
        assert f"\n({letter}) {choice}\n" in text
    assert text.endswith("'A', 'B', 'C', or 'D'.\n")


@pytest.mark.parametrize(("response", "letter"), [
    ("The correct option is (C).", "C"),
    ("I first thought (A), but the answer is b", "b"),  # the last standalone letter counts
    ("Final answer: D", "D"),
    ("ABCD are the options; none fits", INVALID),  # letters inside a word do not count
    ("", INVALID),
])
def test_extract_abcd(response: str, letter: str) -> None:
    assert gpqa.extract_letter(response) == letter


def test_exact_match_ignores_case() -> None:
    docs = gpqa.expand_docs(gpqa.load_rows(SAMPLE), limit=4)
    responses = [f"answer: {d.answer.lower()}" for d in docs[:2]] + ["no idea", "(A)"]
    (score,) = gpqa.score_responses(docs, responses)
    expected = (2 + (docs[3].answer == "A")) / 4
    assert (score.name, score.n, score.score) == ("extract_abcd", 4, expected)


def test_gpqa_jsonl_and_bad_rows(tmp_path: Path) -> None:
    good = tmp_path / "gpqa.jsonl"
    good.write_text('{"Question": "Q?", "Correct Answer": "a", "Incorrect Answer 1": "b", '
                    '"Incorrect Answer 2": "c", "Incorrect Answer 3": "d"}\n')
    assert gpqa.load_rows(good)[0].incorrect == ("b", "c", "d")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"Question": "Q?", "Correct Answer": "a"}\n')
    with pytest.raises(EvalDataError, match=r"bad.jsonl:1: missing or empty GPQA column"):
        gpqa.load_rows(bad)


@pytest.mark.parametrize(("text", "expected"), [
    ("test.jsonl", {"gsm8k": Path("test.jsonl")}),  # the old single-path form
    ("gsm8k=a.jsonl,gpqa=b.csv", {"gsm8k": Path("a.jsonl"), "gpqa": Path("b.csv")}),
    ("gpqa=b.csv", {"gpqa": Path("b.csv")}),
    ("data/x=1.jsonl", {"gsm8k": Path("data/x=1.jsonl")}),  # a path with '=' stays a path
])
def test_eval_data_option(text: str, expected: dict[str, Path]) -> None:
    assert parse_eval_data(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("swebench_lite=x", "swebench_lite=...: not supported: SWE-bench Lite"),
    ("gsm8k=a,mmlu=b", "TASK one of gsm8k, gpqa; got 'mmlu=b'"),
    ("gpqa=", "got 'gpqa='"),
    ("gsm8k=a,gsm8k=b", "gsm8k is given twice"),
])
def test_eval_data_option_errors(text: str, message: str) -> None:
    with pytest.raises(pytest.UsageError, match=message.replace("(", r"\(")):
        parse_eval_data(text)


@pytest.mark.parametrize("accuracy", [0.0, 0.5, 1.0])
def test_choice_oracle_answers_the_eval_prompts(accuracy: float) -> None:
    oracle = load_oracle(SAMPLE, accuracy, seed=3)
    assert isinstance(oracle, ChoiceOracle) and len(oracle) == len(gpqa.load_rows(SAMPLE))
    docs = gpqa.expand_docs(gpqa.load_rows(SAMPLE))
    replies = [oracle.reply(gpqa.doc_to_text(d)) for d in docs]
    assert all(r is not None for r in replies)
    (score,) = gpqa.score_responses(docs, [r or "" for r in replies])
    if accuracy in (0.0, 1.0):
        assert score.score == accuracy
    else:
        assert 0.0 < score.score < 1.0
    # Seeded: the same prompt always gets the same answer.
    assert replies == [oracle.reply(gpqa.doc_to_text(d)) for d in docs]
    assert oracle.reply("What is the capital of France?\n\n(A) Paris") is None


def test_gpqa_data_alone_asks_for_evals(pytester: pytest.Pytester) -> None:
    (pytester.path / "bench-master.yaml").write_text(master_entry())
    result = pytester.runpytest("--collect-only", "-q", f"--inferbench-eval-data=gpqa={SAMPLE}")
    result.stdout.fnmatch_lines(["*::eval-gsm8k", "*::eval-gpqa"])
    bad = pytester.runpytest("--collect-only", "-q", "--inferbench-eval-data=swebench_lite=x")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*swebench_lite=...: not supported: SWE-bench Lite*"])
    assert "Traceback" not in bad.stdout.str() + bad.stderr.str()


def test_unusable_gpqa_data_is_a_usage_error_before_any_server(pytester: pytest.Pytester) -> None:
    (pytester.path / "bench-master.yaml").write_text(master_entry())
    (pytester.path / "bad.jsonl").write_text('{"Question": "Q?", "Correct Answer": "a"}\n')
    result = pytester.runpytest("--inferbench-eval-data=gpqa=bad.jsonl")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--inferbench-eval-data gpqa: bad.jsonl:1: missing or empty "
                                 "GPQA column(s) Incorrect Answer 1*"])
    missing = pytester.runpytest("--inferbench-eval-data=gsm8k=none.jsonl,gpqa=bad.jsonl")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["*--inferbench-eval-data none.jsonl: does not exist*"])
    assert not (pytester.path / "inferbench-results").exists()
