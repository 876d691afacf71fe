"""The Python benchmarks in `benchmarks/python/` run as a user runs them, on the default
backend (all but the cancelled-streams one, which needs HTTP) and that one on `sim-server` at time
scale 0 (a functional check: no timing judged, so a busy machine cannot fail it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "benchmarks" / "python"
CANCELLED = "test_server_survives_cancelled_streams"


def run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, object]]:
    results = pytester.path / "results"
    outcome = pytester.runpytest_subprocess(
        str(EXAMPLES), "-p", "no:cacheprovider", "-rs", f"--inferbench-results={results}",
        *args)
    return outcome, json.loads((results / "summary.json").read_text())


def test_the_python_benchmarks_pass_on_the_default_backend(pytester: pytest.Pytester) -> None:
    outcome, summary = run(pytester)
    outcome.assert_outcomes(passed=4, skipped=1)
    outcome.stdout.fnmatch_lines(["SKIPPED*test_cancelled_streams.py*needs a server over HTTP*"])
    points = summary["points"]
    assert isinstance(points, list) and len(points) == 7
    assert all(p["verdict"] == "passed" and p["backend"] == "sim" for p in points)


def test_the_cancelled_streams_benchmark_passes_over_http(pytester: pytest.Pytester) -> None:
    # Survival is a functional claim: at time scale 0 no timing is measured, so a busy CI
    # machine (client event-loop lag) cannot fail it, and no latency SLO applies.
    functional = pytester.makefile(".yaml", no_gates="slo: []\n")
    outcome, summary = run(pytester, "-k", CANCELLED, "--inferbench-backend", "sim-server",
                           "--inferbench-time-scale", "0", f"--inferbench-gates={functional}",
                           "--inferbench-prompts-per-conc", "2")
    outcome.assert_outcomes(passed=1)
    points = summary["points"]
    assert isinstance(points, list) and len(points) == 1
    assert points[0]["completed"] == points[0]["num_prompts"] == 16
