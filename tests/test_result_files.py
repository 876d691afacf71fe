"""A point's two files in a real plugin run: raw lengths follow the workload options, the raw
file gives back the record (a results directory works as a baseline), and estimated token
counts are flagged on every table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_inferbench.report.tables import ESTIMATED_NOTE, markdown_tables, terminal_tables
from pytest_inferbench.result_files import AGG_PREFIX, point_record
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[1]
RECIPE = master_entry(rows=["{ tp: 4, conc-list: [4] }"], isl=256, osl=32)


def run(pytester: pytest.Pytester, *options: str) -> dict[str, object]:
    """One point on the simulator; its raw file."""
    (pytester.path / "bench-master.yaml").write_text(RECIPE)
    if not (pytester.path / "launch").exists():
        shutil.copytree(REPO / "benchmarks" / "launch", pytester.path / "launch")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-no-plots",
                                           "--inferbench-prompts-per-conc", "5", *options)
    result.assert_outcomes(passed=1)
    points = pytester.path / "inferbench-results" / "points"
    (raw_path,) = [p for p in points.iterdir() if not p.name.startswith(AGG_PREFIX)]
    assert (points / f"{AGG_PREFIX}{raw_path.name}").is_file()
    raw: dict[str, object] = json.loads(raw_path.read_text())
    return raw


def test_range_ratio_one_sends_fixed_lengths(pytester: pytest.Pytester) -> None:
    raw = run(pytester, "--inferbench-random-range-ratio", "1.0")
    assert raw["input_lens"] == [256] * 20 and raw["output_lens"] == [32] * 20
    workload = point_record(raw)["workload"]
    assert isinstance(workload, dict) and workload["random_range_ratio"] == 1.0
    assert workload["warmup"] == "same"


def test_default_range_ratio_varies_lengths_as_inferencex(pytester: pytest.Pytester) -> None:
    raw = run(pytester, "--inferbench-warmup", "distinct")
    inputs, outputs = raw["input_lens"], raw["output_lens"]
    assert isinstance(inputs, list) and isinstance(outputs, list)
    assert all(204 <= n <= 256 for n in inputs) and len(set(inputs)) > 1  # int(0.8 * 256)
    assert all(25 <= n <= 32 for n in outputs) and len(set(outputs)) > 1
    record = point_record(raw)
    assert record["workload"]["warmup"] == "distinct"  # type: ignore[index]
    assert record["simulated"] is True and record["server_node"] and record["config_key"]
    # The results directory (summary.json and the points' raw files) is a baseline.
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--inferbench-no-plots", "--inferbench-prompts-per-conc",
        "5", "--inferbench-warmup", "distinct",
        f"--inferbench-baseline={pytester.path / 'inferbench-results'}",
        "--inferbench-results", "second")
    result.assert_outcomes(passed=1)


def test_estimated_token_counts_are_flagged_on_every_table() -> None:
    row = {"server_node": "node-a", "isl": 1024, "osl": 1024, "conc": 4, "verdict": "passed",
           "token_counts_estimated": True}
    nodes = {"node-a": {"points": [row], "evals": []}}
    assert any(ESTIMATED_NOTE in line for line in terminal_tables(nodes))
    assert ESTIMATED_NOTE in markdown_tables(nodes, {"backend": "external"})
    row["token_counts_estimated"] = False
    assert not any(ESTIMATED_NOTE in line for line in terminal_tables(nodes))
