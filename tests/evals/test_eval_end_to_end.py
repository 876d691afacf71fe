"""The eval item end to end: plugin run on the sim backend, the simulated HTTP server's GSM8K
oracle at an accuracy above and below the threshold, and the skip/required behaviour.

Runs are subprocesses: the eval starts a simulated HTTP server and an HTTP client stack that
in-process pytester runs would import twice."""

from __future__ import annotations

import json
import random
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]
THRESHOLD = 0.8
QUESTIONS = 100
RECIPE = master_entry(rows=["{ tp: 4, conc-start: 1, conc-end: 1 }"], isl=256, osl=16)


def write_gsm8k(path: Path, count: int, seed: int) -> None:
    """GSM8K-format items (question, worked answer ending '#### N') made up for the test."""
    rng = random.Random(seed)
    lines = []
    for i in range(count):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        lines.append(
            json.dumps(
                {
                    "question": f"Ana has {a} shells and finds {b} more on beach {seed}-{i}. "
                    "How many shells does she have?",
                    "answer": f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b} shells.\n#### {a + b}",
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    (pytester.path / "bench-master.yaml").write_text(RECIPE)
    (pytester.path / "launch").mkdir()
    launch = REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml"
    shutil.copy(launch, pytester.path / "launch")
    (pytester.path / "evals").mkdir()
    (pytester.path / "evals/thresholds.json").write_text(
        json.dumps({"default": {"gsm8k": THRESHOLD}})
    )
    (pytester.path / "data").mkdir()
    write_gsm8k(pytester.path / "data/test.jsonl", QUESTIONS, seed=1)
    write_gsm8k(pytester.path / "data/train.jsonl", 5, seed=2)
    return pytester


def eval_properties(project: pytest.Pytester) -> dict[str, str]:
    tree = ET.parse(project.path / "junit.xml")
    case = next(c for c in tree.getroot().iter("testcase") if c.get("name") == "eval-gsm8k")
    return {p.get("name") or "": p.get("value") or "" for p in case.iter("property")}


@pytest.mark.parametrize("accuracy", [0.97, 0.6])
def test_eval_gate_with_the_oracle_above_and_below_threshold(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, accuracy: float
) -> None:
    monkeypatch.setenv("INFERBENCH_SIM_EVAL_ACCURACY", str(accuracy))
    result = project.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--junitxml=junit.xml",
        "--inferbench-eval-data=data/test.jsonl",
        "-m",
        "eval",
    )
    props = eval_properties(project)
    assert props["eval_samples"] == str(QUESTIONS)  # train.jsonl gave the shots: all scored
    for name in ("strict-match", "flexible-extract"):
        score = float(props[f"exact_match,{name}"])
        stderr = float(props[f"exact_match_stderr,{name}"])
        # The oracle is right with probability `accuracy` per question: a binomial sample.
        binomial_se = (accuracy * (1 - accuracy) / QUESTIONS) ** 0.5
        assert abs(score - accuracy) < 4 * binomial_se
        assert stderr == pytest.approx((score * (1 - score) / (QUESTIONS - 1)) ** 0.5, abs=1e-4)
    if accuracy > THRESHOLD:
        result.assert_outcomes(passed=1, deselected=1)
    else:
        result.assert_outcomes(failed=1, deselected=1)
        result.stdout.re_match_lines(
            [
                r".*gsm8k exact_match,strict-match = 0\.\d{4} ± 0\.\d{4} \(n=100\) < 0\.8 "
                r"\(default in .*thresholds\.json\)",
                r".*gsm8k exact_match,flexible-extract = 0\.\d{4} ± .*< 0\.8",
            ]
        )
    result.stdout.re_match_lines(
        [
            r"\s*eval gsm8k: strict-match 0\.\d{4} ± 0\.\d{4}, "
            r"flexible-extract .*\(n=100, threshold 0\.8\)"
        ]
    )
    written = list((project.path / "inferbench-results/evals").rglob("results_*.json"))
    lm_eval_layout = json.loads(written[0].read_text())
    assert lm_eval_layout["results"]["gsm8k"]["exact_match,strict-match"] == pytest.approx(
        float(props["exact_match,strict-match"]), abs=1e-4
    )


def test_eval_without_data_skips_with_the_reason(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-m", "eval", "-rs")
    result.assert_outcomes(skipped=1, deselected=1)
    result.stdout.fnmatch_lines(["*no GSM8K data: pass --inferbench-eval-data=PATH*"])


def test_eval_without_data_fails_when_required(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "-m", "eval", "-o", "inferbench_eval_required=true"
    )
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*no GSM8K data*inferbench_eval_required is set*"])


def test_not_eval_deselects_the_eval_item(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-m", "not eval")
    result.assert_outcomes(passed=1, deselected=1)


def test_eval_skips_when_the_launch_spec_forces_acceptance(project: pytest.Pytester) -> None:
    launch = project.path / "launch/minimaxm3_fp4_mi355x_atom.yaml"
    text = launch.read_text()
    launch.write_text(
        text.replace(
            "args: [--model,",
            'args: [--spec-decode-acceptance-length, "2.5", --method, eagle3, '
            '--num-speculative-tokens, "3", --model,',
            1,
        )
    )
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "-m", "eval", "-rs", "--inferbench-eval-data=data/test.jsonl"
    )
    result.assert_outcomes(skipped=1, deselected=1)
    result.stdout.fnmatch_lines(
        ["*forces a synthetic acceptance length (--spec-decode-acceptance-length 2.5)*"]
    )
