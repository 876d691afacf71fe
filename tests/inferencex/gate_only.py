"""Run chosen points inside an InferenceX checkout and check each passed or failed on a gate only.

Shared by the single-node and multinode sample tests: the run (xdist, JUnit, one prompt per
slot), the JUnit verdicts (no error, no skip) and summary.json's agreement with them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def run_and_check(checkout: Path, node_ids: list[str], timeout_s: int) -> None:
    junit = checkout / "junit.xml"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
         f"--junitxml={junit}", "--inferbench-no-plots", "--inferbench-prompts-per-conc", "1",
         *node_ids],
        cwd=checkout, capture_output=True, text=True, timeout=timeout_s,
        env={**os.environ, "COLUMNS": "200"})
    assert result.returncode in (0, 1), result.stdout[-3000:] + result.stderr[-3000:]
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    assert len(cases) == len(node_ids)
    failed = 0
    for case in cases:
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        assert kinds in ([], ["failure"]), (case.get("name"), kinds, case.find(kinds[0]).text)
        failed += bool(kinds)
    # Every point has a result; those that failed list the gate findings they failed on.
    summary = json.loads((checkout / "inferbench-results" / "summary.json").read_text())
    points = {p["nodeid"]: p for p in summary["points"]}
    assert sorted(points) == sorted(node_ids)
    assert sum(bool(p["gate_failures"]) for p in points.values()) == failed
