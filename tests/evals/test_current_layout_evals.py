"""Evals in InferenceX's current layout (`configs/`, `utils/evals/thresholds.yaml`): an eval
item is collected, judged against the threshold InferenceX's own `validate_scores.py` resolves
for the same model and task (per-model floors included), and that script, run in the item's
eval directory, passes or fails with the item. GSM8K runs on the real test split (train split
as shot pool), GPQA diamond on a small made-up sample in GPQA's columns; the simulator's oracle
answers both with a seeded accuracy, so each run gets the same scores.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest

from pytest_inferbench.evals.thresholds import MIN_SCORE, lookup_threshold
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]
CURRENT = REPO.parent / "shared" / "inferencex-0801"
EVALS = CURRENT / "utils" / "evals"
VALIDATE = EVALS / "validate_scores.py"
GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
GPQA_SAMPLE = Path(__file__).parent / "data" / "gpqa_sample.csv"
GPQA_TASK = "gpqa_diamond_cot_n_shot"
NODE = "{}-fp4-mi355x-atom-tp4"
AGENTIC = """\
agent-fp4-mi355x-atom:
  image: img
  model: amd/MiniMax-M3-MXFP4
  model-prefix: minimaxm3
  runner: mi355x
  precision: fp4
  framework: atom
  multinode: false
  scenarios:
    agentic-coding:
      - duration: 900
        search-space:
          - { tp: 4, offloading: cpu, conc-list: [4] }
"""

pytestmark = pytest.mark.skipif(
    not (VALIDATE.is_file() and (EVALS / "thresholds.yaml").is_file()
         and (GSM8K / "test.jsonl").is_file()),
    reason="needs the current InferenceX tree and GSM8K data under ../shared")


def validate_scores() -> ModuleType:
    """InferenceX's own script, imported to ask its `resolve_threshold`."""
    spec = importlib.util.spec_from_file_location("validate_scores", VALIDATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inferencex_threshold(prefix: str, task: str) -> float:
    script = validate_scores()
    config = script.load_config(str(EVALS / "thresholds.yaml"))
    value, _ = script.resolve_threshold(config, prefix, task, MIN_SCORE)
    return float(value)


@pytest.mark.parametrize(("prefix", "task"), [
    ("glm5", "gsm8k"),  # a per-model floor above the default
    ("kimik2.5", "gsm8k"),  # a per-model entry equal to the default
    ("minimaxm3", "gsm8k"),  # no per-model entry: the default
    ("dsr1", "gpqa_diamond_cot_n_shot"),  # a per-model entry for another task only
    ("minimaxm3", "mmlu"),  # no entry anywhere: validate_scores' --min-score default
])
def test_lookup_is_validate_scores_lookup(prefix: str, task: str) -> None:
    ours = lookup_threshold(EVALS / "thresholds.yaml", prefix, task)
    assert ours.value == inferencex_threshold(prefix, task)


def current_checkout(root: Path, master: str) -> Path:
    """A checkout in InferenceX's current layout: configs/, the root changelog, and
    utils/evals/ with its thresholds.yaml; glm5 is served by the MiniMax-M3 launch spec."""
    (root / "configs" / "launch").mkdir(parents=True)
    (root / "configs" / "amd-master.yaml").write_text(master)
    (root / "perf-changelog.yaml").write_text("[]\n")
    shutil.copytree(EVALS, root / "utils" / "evals",
                    ignore=shutil.ignore_patterns("test_*", "patches", "__pycache__"))
    shutil.copy(REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml",
                root / "configs" / "launch" / "glm5_fp4_mi355x_atom.yaml")
    return root


def entry(prefix: str) -> str:
    return master_entry(key=f"{prefix}-fp4-mi355x-atom", model_prefix=prefix,
                        rows=["{ tp: 4, conc-list: [16] }"], isl=8192, osl=1024)


def run_evals(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, master: str,
              accuracy: float, data: str) -> tuple[pytest.RunResult, dict[str, ET.Element]]:
    """The eval items of `master` in a current-layout checkout; (run, {node::item: case})."""
    root = current_checkout(pytester.path, master)
    monkeypatch.setenv("INFERBENCH_SIM_EVAL_ACCURACY", str(accuracy))
    junit = root / "junit.xml"
    # A subprocess: an in-process run forgets the HTTP modules it imported, and the next
    # run's connection errors would be of classes the first run's code catches.
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-m", "eval", "-rs", f"--junitxml={junit}",
        f"--inferbench-eval-data={data}", "--inferbench-eval-limit", "200")
    cases = {f"{c.get('classname', '').rpartition('.')[2]}::{c.get('name')}": c
             for c in ET.parse(junit).getroot().iter("testcase")
             if c.get("name", "").startswith("eval-")}
    return result, cases


def properties(case: ET.Element) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in case.iter("property")}


def verdict(case: ET.Element) -> str:
    return ("failed" if case.find("failure") is not None else
            "skipped" if case.find("skipped") is not None else "passed")


def run_validate_scores(workspace: Path) -> subprocess.CompletedProcess[str]:
    """The current tree's script as its workflow runs it: in the eval workspace, no options
    (its own utils/evals/thresholds.yaml, the prefix from meta_env.json)."""
    env = {k: v for k, v in os.environ.items() if k != "MODEL_PREFIX"}
    return subprocess.run([sys.executable, str(VALIDATE)], cwd=workspace, capture_output=True,
                          text=True, env=env, check=False)


def assert_agrees(pytester: pytest.Pytester, case: ET.Element, workspace: str, prefix: str,
                  task: str) -> None:
    """The item's threshold is InferenceX's, and validate_scores.py in the item's eval
    directory passes exactly when the item does."""
    props = properties(case)
    assert props["eval_task"] == task
    threshold = inferencex_threshold(prefix, task)
    assert float(props["eval_threshold"]) == threshold
    scores = [float(v) for k, v in props.items() if k.startswith("exact_match,")]
    assert scores
    passes = verdict(case) == "passed"
    assert all(score >= threshold for score in scores) is passes
    done = run_validate_scores(pytester.path / "inferbench-results" / "evals" / workspace)
    output = done.stdout + done.stderr
    assert f"Model prefix: {prefix}" in output
    assert f"{task} exact_match," in output
    assert (done.returncode == 0) is passes, output


def test_gsm8k_and_gpqa_judged_as_inferencex_judges_them(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Accuracy 0.92: above the GSM8K default 0.90 (minimaxm3 passes) and below glm5's own
    0.94 floor (glm5 fails); GPQA diamond runs on the simulator for both and passes its 0.30."""
    result, cases = run_evals(pytester, monkeypatch,
                              entry("minimaxm3") + entry("glm5") + AGENTIC, 0.92,
                              f"gsm8k={GSM8K / 'test.jsonl'},gpqa={GPQA_SAMPLE}")
    expected = {
        (NODE.format("minimaxm3"), "eval-gsm8k"): "passed",
        (NODE.format("glm5"), "eval-gsm8k"): "failed",
        (NODE.format("minimaxm3"), "eval-gpqa"): "passed",
        (NODE.format("glm5"), "eval-gpqa"): "passed",
        ("agent-fp4-mi355x-atom-tp4-agentic-offload-cpu", "eval-swebench_lite"): "skipped",
    }
    assert {tuple(k.split("::")): verdict(c) for k, c in cases.items()} == expected
    # The agentic node's SWE-bench Lite and the task the thresholds name are both reported.
    result.stdout.fnmatch_lines([
        "*thresholds.yaml names swebench_lite: not run here (SWE-bench Lite*",
        "*amd-master.yaml: swebench_lite: not supported: SWE-bench Lite*"], consecutive=False)
    for prefix in ("minimaxm3", "glm5"):
        node = NODE.format(prefix)
        assert_agrees(pytester, cases[f"{node}::eval-gsm8k"], node, prefix, "gsm8k")
        assert_agrees(pytester, cases[f"{node}::eval-gpqa"], f"{node}-gpqa", prefix, GPQA_TASK)
    gpqa_dir = pytester.path / "inferbench-results" / "evals" / f"{NODE.format('glm5')}-gpqa"
    (results_file,) = gpqa_dir.glob("results*.json")
    with GPQA_SAMPLE.open(encoding="utf-8", newline="") as handle:
        rows = len(list(csv.DictReader(handle)))
    # Every question asked twice, its answers shuffled each time.
    assert json.loads(results_file.read_text())["n-samples"][GPQA_TASK]["effective"] == 2 * rows


def test_087_passes_the_old_minimum_and_fails_inferencex(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    _, cases = run_evals(pytester, monkeypatch, entry("minimaxm3"), 0.87,
                         str(GSM8K / "test.jsonl"))  # the single-path form: GSM8K
    node = NODE.format("minimaxm3")
    case = cases[f"{node}::eval-gsm8k"]
    assert verdict(case) == "failed"
    # The score lies where the two thresholds disagree.
    assert MIN_SCORE <= float(properties(case)["exact_match,strict-match"]) < 0.90
    assert_agrees(pytester, case, node, "minimaxm3", "gsm8k")


def test_gpqa_below_its_threshold_fails_in_both(pytester: pytest.Pytester,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    result, cases = run_evals(pytester, monkeypatch, entry("minimaxm3"), 0.1,
                              f"gpqa={GPQA_SAMPLE}")
    node = NODE.format("minimaxm3")
    # The thresholds file asks for GSM8K, which has no data here: it skips, saying so.
    assert verdict(cases[f"{node}::eval-gsm8k"]) == "skipped"
    result.stdout.fnmatch_lines(["*no GSM8K data: pass --inferbench-eval-data=PATH*"])
    case = cases[f"{node}::eval-gpqa"]
    assert verdict(case) == "failed"
    assert_agrees(pytester, case, f"{node}-gpqa", "minimaxm3", GPQA_TASK)
