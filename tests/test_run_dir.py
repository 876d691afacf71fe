"""The results directory belongs to one run: an earlier run's results are moved aside, never
mixed; temp files of a killed writer are removed; every result carries the run id; a baseline
that mixes runs is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_inferbench.testing.recipes import master_entry

RECIPE = master_entry(rows=["{ tp: 4, conc-list: [1, 2] }"], isl=256, osl=16)


def _raw_points(results: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted((results / "points").glob("*.json"))
            if not p.name.startswith("agg_")]


def test_a_rerun_moves_the_earlier_results_aside(pytester: pytest.Pytester) -> None:
    (pytester.path / "bench-master.yaml").write_text(RECIPE)
    results = pytester.path / "inferbench-results"
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)
    first_id = json.loads((results / "run.json").read_text())["run_id"]
    assert {p["inferbench"]["run_id"] for p in _raw_points(results)} == {first_id}  # type: ignore[index]
    # A writer killed mid-write left this (its pid is long gone).
    stale = results / "points" / ".x.json.999999999.abc123.tmp"
    stale.write_text("{")
    second = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "conc2")
    second.assert_outcomes(passed=1)
    aside = pytester.path / f"inferbench-results.{first_id}"
    second.stdout.fnmatch_lines(["inferbench: removed 1 temporary file(s)*",
                                 f"inferbench: *inferbench-results held the results of run "
                                 f"{first_id}: moved aside to *inferbench-results.{first_id}*"])
    second_id = json.loads((results / "run.json").read_text())["run_id"]
    assert second_id != first_id
    points = _raw_points(results)
    assert [p["max_concurrency"] for p in points] == [2]  # the subset only, never mixed
    assert {p["inferbench"]["run_id"] for p in points} == {second_id}  # type: ignore[index]
    assert len(_raw_points(aside)) == 2 and not list(aside.rglob("*.tmp"))
    summary = json.loads((results / "summary.json").read_text())
    assert summary["metadata"]["run_id"] == second_id
    # Two runs' point files in one directory are not one baseline.
    mixed = pytester.path / "mixed"
    shutil.copytree(results / "points", mixed)
    for raw in (aside / "points").glob("*conc1*"):
        shutil.copy(raw, mixed / raw.name)
    refused = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                            "--inferbench-baseline=mixed")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*baseline */mixed mixes the results of 2 runs*"])
    assert "Traceback" not in refused.stdout.str() + refused.stderr.str()
