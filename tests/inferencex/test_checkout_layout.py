"""Inside a copy of InferenceX's repository: recipes under .github/configs, the root changelog
and utils/evals/thresholds.json are found, and the packaged launch specs used, with no
configuration at all."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from .conftest import inferencex_source

# The shared data sit beside the InferenceX checkout (../shared/data/gsm8k).
GSM8K = inferencex_source().parent / "data" / "gsm8k" / "test.jsonl"


def test_minimaxm3_atom_sweep_with_evals_and_changelog_at_the_root(inferencex_copy: Path) -> None:
    # No configuration: the launch specs come with the package.
    assert not (inferencex_copy / "pytest.ini").exists()
    junit = inferencex_copy / "junit.xml"
    # (not the atom-disagg multinode entry, which has its own test: test_multinode_sample.py)
    args = ["-p", "no:cacheprovider", "-q", "-k", "minimaxm3 and mi355x and atom and not disagg",
            f"--junitxml={junit}", "--inferbench-no-plots", "--inferbench-eval-limit", "20"]
    if GSM8K.is_file():
        args.append(f"--inferbench-eval-data={GSM8K}")
    result = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=inferencex_copy,
                            capture_output=True, text=True, timeout=900,
                            env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stdout[-3000:]
    cases = ET.parse(junit).getroot().iter("testcase")
    by_kind: dict[str, list[ET.Element]] = {"point": [], "eval": [], "changelog": []}
    for case in cases:
        if case.find("skipped") is not None:
            continue
        name = case.get("name", "")
        kind = ("eval" if name == "eval-gsm8k" else
                "changelog" if name.startswith("entry") else "point")
        by_kind[kind].append(case)
    # 4 ATOM server nodes (MXFP4/MXFP8, with and without EAGLE3) x 18 points each.
    assert len(by_kind["point"]) == 72
    assert len(by_kind["eval"]) == 4
    # InferenceX requires 0.90 for this model (default of utils/evals/thresholds.json).
    thresholds = {p.get("value") for case in by_kind["eval"]
                  for p in case.iter("property") if p.get("name") == "eval_threshold"}
    assert thresholds == {"0.9"}
    # The root perf-changelog.yaml's entries that name these configs.
    assert len(by_kind["changelog"]) >= 1
    assert all(case.get("classname", "").startswith("perf-changelog") or
               "perf-changelog" in case.get("file", "perf-changelog")
               for case in by_kind["changelog"])
