"""GSM8K prompt and scoring, case by case against lm-eval's gsm8k filter and metric rules."""

from __future__ import annotations

import json
import random
import re
from typing import TYPE_CHECKING

import pytest

from pytest_inferbench.evals.gsm8k import (
    FILTERS,
    INVALID,
    EvalDataError,
    GsmItem,
    build_messages,
    build_prompt,
    exact_match,
    extract,
    mean_and_stderr,
    sample_shots,
    score_responses,
    split_shots,
)
from pytest_inferbench.evals.thresholds import (
    Threshold,
    ThresholdsError,
    check_eval,
    lookup_threshold,
)
from pytest_inferbench.testing.recipes import master_entry

if TYPE_CHECKING:
    from pathlib import Path

STRICT, FLEXIBLE = (pattern for _, pattern in FILTERS)
GOLD = "Tom has 2 + 3 = <<2+3=5>>5 apples.\n#### 5"


@pytest.mark.parametrize(
    ("response", "strict", "flexible"),
    [
        ("2 + 3 = 5 apples.\n#### 5", "5", "5"),
        # Several markers: both filters take the LAST match (InferenceX gsm8k.yaml).
        ("#### 4\nWait, recount.\n#### 5", "5", "5"),
        # No marker: strict-match has nothing; flexible-extract takes the last number.
        ("He buys 12 and sells 7, so 5 are left", INVALID, "5"),
        # A dollar amount with a thousands separator and a full stop.
        ("The total is $1,234.", INVALID, "$1,234."),
        ("#### -3", "-3", "-3"),
        ("no numbers at all", INVALID, INVALID),
    ],
)
def test_filters_extract_like_lm_eval(response: str, strict: str, flexible: str) -> None:
    assert extract(response, STRICT) == strict
    assert extract(response, FLEXIBLE) == flexible


@pytest.mark.parametrize(
    ("prediction", "reference", "equal"),
    [
        ("5", GOLD, True),  # "(?s).*#### " strips the worked solution from the reference
        ("$1,234.", "x\n#### 1234", True),  # ",", "$" and a trailing "." are ignored
        ("1234.5", "#### 1234", False),
        (INVALID, GOLD, False),
        ("05", GOLD, False),  # exact string match, not numeric equality
    ],
)
def test_exact_match_ignores_what_lm_eval_ignores(
    prediction: str, reference: str, equal: bool
) -> None:
    assert exact_match(prediction, reference) is equal


def test_scores_and_sample_stderr() -> None:
    items = [GsmItem(f"q{i}", f"#### {i}") for i in range(4)]
    responses = ["#### 0", "it is 1", "#### 7", "#### 3"]
    strict, flexible = score_responses(items, responses)
    # strict: hits 1,0,0,1 -> 0.5; flexible: 1,1,0,1 -> 0.75
    assert (strict.name, strict.score, strict.n) == ("strict-match", 0.5, 4)
    assert (flexible.name, flexible.score) == ("flexible-extract", 0.75)
    # sample std (ddof 1) / sqrt(n): for 1,1,0,1 the std is 0.5, so stderr 0.25
    assert flexible.stderr == pytest.approx(0.25)
    assert mean_and_stderr([1.0, 0.0]) == pytest.approx((0.5, 0.5))


def test_prompt_is_five_shot_lm_eval_layout() -> None:
    shots = [GsmItem("A?", "a\n#### 1"), GsmItem("B?", "b\n#### 2")]
    tail = (
        "\nEnd your response with the answer on the last line, formatted as: #### [number]\nAnswer:"
    )
    assert build_prompt(shots, "C?") == (
        f"Question: A?{tail} a\n#### 1\n\nQuestion: B?{tail} b\n#### 2\n\nQuestion: C?{tail}"
    )


def test_chat_messages_are_one_user_turn_as_lm_eval_sends_them() -> None:
    shots = [GsmItem("A?", "a\n#### 1")]
    tail = (
        "\nEnd your response with the answer on the last line, formatted as: #### [number]\nAnswer:"
    )
    assert build_messages(shots, "C?") == [
        {"role": "user", "content": f"Question: A?{tail} a\n#### 1\n\nQuestion: C?{tail}"},
    ]


def test_shots_are_drawn_per_question_as_lm_eval_default_sampler() -> None:
    pool = [GsmItem(f"Q{i}?", f"a\n#### {i}") for i in range(50)]
    shots = sample_shots(pool, 3)
    # lm-eval: random.Random(fewshot_random_seed=1234), then sample(fewshot docs, 5) per doc.
    rng = random.Random(1234)
    assert shots == [rng.sample(pool, 5) for _ in range(3)]
    assert shots[0] != shots[1]


def write_jsonl(path: Path, count: int, start: int = 0) -> Path:
    path.write_text(
        "".join(
            json.dumps(
                {"question": f"What is {i} plus 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
            )
            + "\n"
            for i in range(start, start + count)
        )
    )
    return path


def test_shots_come_from_train_beside_test_else_first_five(tmp_path: Path) -> None:
    test = write_jsonl(tmp_path / "test.jsonl", 8)
    shots, scored = split_shots(test)
    assert [s.question for s in shots] == [f"What is {i} plus 1?" for i in range(5)]
    assert len(scored) == 3  # the shots are not scored
    write_jsonl(tmp_path / "train.jsonl", 6, start=100)
    shots, scored = split_shots(test, limit=4)
    assert shots[0].question == "What is 100 plus 1?" and len(shots) == 6  # the whole pool
    assert len(scored) == 4


def test_bad_data_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "test.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q2"}\n')
    with pytest.raises(EvalDataError, match=r"test\.jsonl:2: expected a JSON object"):
        split_shots(path)


def test_threshold_lookup_order(tmp_path: Path) -> None:
    path = tmp_path / "thresholds.json"
    path.write_text(json.dumps({"default": {"gsm8k": 0.9}, "models": {"dsr1": {"gsm8k": 0.91}}}))
    assert lookup_threshold(path, "dsr1", "gsm8k").value == 0.91
    assert lookup_threshold(path, "minimaxm3", "gsm8k") == Threshold(0.9, f"default in {path}")
    assert lookup_threshold(path, "minimaxm3", "other").value == 0.85
    assert lookup_threshold(None, "minimaxm3", "gsm8k").value == 0.85
    path.write_text(json.dumps({"gsm8k": 0.8}))  # legacy flat file = the default
    assert lookup_threshold(path, "dsr1", "gsm8k").value == 0.8


@pytest.mark.parametrize(("text", "message"), [
    ("default:\n  gsm8k: [", r"thresholds\.yaml:\d+: "),  # a syntax error names its line
    ("default: {gsm8k: .nan}\n",
     re.escape("default.gsm8k: expected a score within [0, 1], got nan")),
    ("models:\n  dsr1:\n", "models.dsr1: expected a mapping of task -> minimum score"),
    ("- 0.9\n", "expected a mapping with 'default' and/or 'models'"),
])
def test_threshold_yaml_errors_name_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "thresholds.yaml"
    path.write_text(text)
    with pytest.raises(ThresholdsError, match=message):
        lookup_threshold(path, "dsr1", "gsm8k")


def test_threshold_yaml_lookup(tmp_path: Path) -> None:
    path = tmp_path / "thresholds.yaml"
    path.write_text("# comment\ndefault:\n  gsm8k: 0.90\n  gpqa_diamond_cot_n_shot: 0.30\n"
                    "models:\n  dsr1:\n    gsm8k: 0.91\n")
    assert lookup_threshold(path, "dsr1", "gsm8k") == Threshold(0.91, f"models.dsr1 in {path}")
    assert lookup_threshold(path, "dsr1", "gpqa_diamond_cot_n_shot").value == 0.30
    assert lookup_threshold(path, "glm5", "gsm8k").value == 0.90


def test_gate_needs_every_filter_to_pass() -> None:
    from pytest_inferbench.evals.gsm8k import FilterScore
    from pytest_inferbench.evals.runner import EvalResult

    scores = (
        FilterScore("strict-match", 0.95, 0.01, 100),
        FilterScore("flexible-extract", 0.88, 0.03, 100),
    )
    result = EvalResult("gsm8k", "minimaxm3", "/v1/chat/completions", 100, scores, 0, "", 1.0, 8)
    assert check_eval(result, Threshold(0.9, "default in t.json")) == [
        "gsm8k exact_match,flexible-extract = 0.8800 ± 0.0300 (n=100) < 0.9 (default in t.json)"
    ]
    assert check_eval(result, Threshold(0.85, "x")) == []


def test_thresholds_file_yaml_first_then_json(tmp_path: Path) -> None:
    from pytest_inferbench.recipe.layout import BESIDE_RECIPES, discover

    recipe = tmp_path / "bench-master.yaml"
    recipe.write_text(master_entry())
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "thresholds.json").write_text("{}")
    assert BESIDE_RECIPES.thresholds_for(recipe) == tmp_path / "evals" / "thresholds.json"
    (tmp_path / "evals" / "thresholds.yaml").write_text("{}")
    assert BESIDE_RECIPES.thresholds_for(recipe) == tmp_path / "evals" / "thresholds.yaml"
    # An InferenceX checkout: utils/evals/thresholds.yaml in the current layout, .json before.
    root = tmp_path / "InferenceX"
    (root / "configs").mkdir(parents=True)
    (root / "configs" / "amd-master.yaml").write_text(master_entry())
    (root / "perf-changelog.yaml").write_text("[]\n")
    (root / "utils" / "evals").mkdir(parents=True)
    (root / "utils" / "evals" / "thresholds.json").write_text("{}")

    def found() -> Path | None:
        return discover(root, ("*-master.yaml",), recipe_dirs=[], changelog="", thresholds="",
                        launch_dir="").thresholds

    assert found() == root / "utils" / "evals" / "thresholds.json"
    (root / "utils" / "evals" / "thresholds.yaml").write_text("{}")
    assert found() == root / "utils" / "evals" / "thresholds.yaml"
