"""InferenceX's own `utils/evals/validate_scores.py` reads a node's eval directory and agrees
with the plugin's gate: a plugin run on the simulator, its GSM8K oracle right with probability
0.937 (the ATOM recipe's measured score) or 0.87, InferenceX's thresholds.json (minimaxm3 has
no override: gsm8k >= 0.90) and the first 500 questions of the real GSM8K test split with its
train split as shot pool (the oracle's verdicts are seeded: the same scores every run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
VALIDATE = SHARED / "inferencex" / "utils" / "evals" / "validate_scores.py"
THRESHOLDS = SHARED / "inferencex" / "utils" / "evals" / "thresholds.json"
GSM8K = SHARED / "data" / "gsm8k"
RECIPE = master_entry(rows=["{ tp: 4, conc-list: [8, 16, 32] }"], isl=8192, osl=1024)
NODE = "minimaxm3-fp4-mi355x-atom-tp4"


@pytest.mark.skipif(not (VALIDATE.is_file() and (GSM8K / "test.jsonl").is_file()),
                    reason="needs the InferenceX checkout and GSM8K data under ../shared")
@pytest.mark.parametrize(("accuracy", "passes"), [(0.937, True), (0.87, False)])
def test_validate_scores_agrees_with_the_gate(pytester: pytest.Pytester,
                                              monkeypatch: pytest.MonkeyPatch,
                                              accuracy: float, passes: bool) -> None:
    (pytester.path / "bench-master.yaml").write_text(RECIPE)
    (pytester.path / "launch").mkdir()
    shutil.copy(REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml", pytester.path / "launch")
    (pytester.path / "evals").mkdir()
    shutil.copy(THRESHOLDS, pytester.path / "evals" / "thresholds.json")
    for split in ("test", "train"):
        shutil.copy(GSM8K / f"{split}.jsonl", pytester.path / f"{split}.jsonl")
    monkeypatch.setenv("INFERBENCH_SIM_EVAL_ACCURACY", str(accuracy))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "eval",
                                           "--inferbench-eval-data=test.jsonl",
                                           "--inferbench-eval-limit", "500")
    result.assert_outcomes(**({"passed": 1} if passes else {"failed": 1}), deselected=3)

    workspace = pytester.path / "inferbench-results" / "evals" / NODE
    (results_file,) = workspace.glob("results*.json")
    meta = json.loads((workspace / "meta_env.json").read_text())
    assert meta["infmax_model_prefix"] == "minimaxm3" and meta["hw"] == "mi355x"
    assert (meta["framework"], meta["precision"], meta["spec_decoding"]) == ("atom", "fp4", "none")
    assert (meta["tp"], meta["ep"], meta["dp_attention"], meta["is_multinode"]) == (
        4, 1, False, False)
    assert (meta["conc"], meta["isl"], meta["osl"]) == (32, "8192", "1024")  # highest >= 16
    data = json.loads(results_file.read_text())
    assert data["inferbench"]["simulated"] is True
    assert data["n-samples"]["gsm8k"]["effective"] == 500
    assert data["config"]["model_args"]["num_concurrent"] == 32

    env = {k: v for k, v in os.environ.items() if k != "MODEL_PREFIX"}
    done = subprocess.run(
        [sys.executable, str(VALIDATE), "--thresholds", str(THRESHOLDS), "--expected-concs", "32"],
        cwd=workspace, capture_output=True, text=True, env=env, check=False)
    output = done.stdout + done.stderr
    assert "Model prefix: minimaxm3" in output
    assert (done.returncode == 0) is passes, output
    verdict = "PASS" if passes else "FAIL"
    for name in ("strict-match", "flexible-extract"):
        assert f"{verdict}: gsm8k exact_match,{name} = " in output
    assert "from default" in output
