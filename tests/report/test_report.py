"""Reports from real pytest runs of the plugin on the default simulator backend."""

from __future__ import annotations

import json
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

# In-process pytester runs drop modules first imported during a run; numpy cannot be imported
# twice in one process, so the simulator and plotting stacks are imported here, once.
import pytest_inferbench.backends.sim
import pytest_inferbench.report.plots  # noqa: F401
from pytest_inferbench.results.measurement import SIMULATED_NOTE
from pytest_inferbench.sim import expected_error
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]
RECIPE = master_entry(
    rows=[
        "{ tp: 4, conc-start: 1, conc-end: 2 }",
        "{ tp: 4, spec-decoding: mtp, conc-start: 2, conc-end: 2 }",
    ],
    osl=64,
)
NODES = ("minimaxm3-fp4-mi355x-atom-tp4", "minimaxm3-fp4-mi355x-atom-tp4-mtp")


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    (pytester.path / "bench-master.yaml").write_text(RECIPE)
    (pytester.path / "launch").mkdir()
    shutil.copy(REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml", pytester.path / "launch")
    return pytester


def summary_tables(output: list[str]) -> list[str]:
    """The node tables of the terminal summary (from the header to before the 'wrote' lines)."""
    start = next(i for i, line in enumerate(output) if "inferbench results" in line)
    return [
        line
        for line in output[start:]
        if line.strip()
        and not line.startswith("inferbench:")
        and " in " not in line.split("passed")[-1][:4]
    ][:-1]


def test_tables_summary_json_plots_and_junit(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    step_summary = project.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    result = project.runpytest("-p", "no:cacheprovider", "--junitxml=junit.xml")
    result.assert_outcomes(passed=3)
    text = result.stdout.str()
    for node in NODES:
        assert f"{node}  [{SIMULATED_NOTE}]" in text
    result.stdout.re_match_lines(
        [
            r"\s*ISL/OSL\s+conc @rate\s+in flight\s+tput/GPU tok/s\s+out tput/GPU tok/s\s+"
            r"intvty tok/s/user\s+TTFT p50 s\s+TTFT p99 s\s+TPOT p50 ms\s+"
            r"E2EL p50 s\s+AL \(golden\)\s+J/out tok\s+verdict",
            r"\s*1024/64\s+1\s+[\d.]+\s+[\d.]+\s+.*\s+-\s+[\d.]+\s+passed",
            r"\s*1024/64\s+2\s+[\d.]+\s+[\d.]+\s+.*\s+[\d.]+ \(2\.83\)\s+[\d.]+\s+passed",
        ]
    )

    summary = json.loads((project.path / "inferbench-results/summary.json").read_text())
    meta = summary["metadata"]
    assert meta["backend"] == "sim" and meta["simulated"] is True
    assert meta["images"] == ["rocm/atom-dev:MiniMax-M3-20260623"]
    assert {"plugin_version", "git_commit", "host", "docker_engine"} <= set(meta)
    points = {(p["server_node"], p["conc"]): p for p in summary["points"]}
    assert set(points) == {(NODES[0], 1), (NODES[0], 2), (NODES[1], 2)}
    spec_point = points[(NODES[1], 2)]
    assert spec_point["golden_acceptance_length"] == 2.83  # k=3, thinking on
    assert spec_point["acceptance_length"] > 1.0
    # The calibration set ran no speculation: the MTP node is not its family, the plain one is.
    assert spec_point["expected_error"]["regime"].startswith(f"{expected_error.UNCALIBRATED},")
    assert points[(NODES[0], 1)]["expected_error"]["regime"].startswith(
        f"{expected_error.CALIBRATED},")

    # JUnit: the same numbers as the summary, as properties of each point's testcase.
    tree = ET.parse(project.path / "junit.xml")
    for case in tree.getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        point = points[(props["server_node"], int(props["conc"]))]
        assert float(props["tput_per_gpu"]) == pytest.approx(point["tput_per_gpu"], rel=1e-6)
        assert props["simulated"] == "True"

    png = project.path / "inferbench-results/plots/minimaxm3_isl1024_osl64.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = step_summary.read_text()
    assert f"> **{SIMULATED_NOTE}.**" in markdown and f"### {NODES[0]} (simulated)" in markdown
    assert markdown.count("| 1024/64 |") == 3


def test_xdist_gives_the_same_summary(project: pytest.Pytester) -> None:
    serial = project.runpytest("-p", "no:cacheprovider")
    serial.assert_outcomes(passed=3)
    parallel = project.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    parallel.assert_outcomes(passed=3)
    assert summary_tables(parallel.outlines) == summary_tables(serial.outlines)
    # titles, headers, rules, expected-error lines, 3 rows
    assert len(summary_tables(serial.outlines)) == 2 * 4 + 3


def test_gate_failure_is_one_line_and_shows_in_the_table(project: pytest.Pytester) -> None:
    (project.path / "gates.yaml").write_text(
        "slo:\n  - match: {conc: 2}\n    require:\n      - tput_per_gpu >= 1000000\n"
    )
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.re_match_lines(
        [
            r".*tput_per_gpu [\d.]+ tok/s/GPU < 1000000\.0 tok/s/GPU "
            r"\(gates\.yaml:4\)"
        ]
    )
    result.stdout.re_match_lines([r"\s*1024/64\s+2\s+.*failed"])


def test_saved_baseline_is_used_by_the_next_run(project: pytest.Pytester) -> None:
    project.runpytest(
        "-p", "no:cacheprovider", "--inferbench-save-baseline=base.json"
    ).assert_outcomes(passed=3)
    baseline = json.loads((project.path / "base.json").read_text())
    assert len(baseline["points"]) == 3
    # The simulator is deterministic at a fixed seed: the same run is within any tolerance.
    project.runpytest("-p", "no:cacheprovider", "--inferbench-baseline=base.json").assert_outcomes(
        passed=3
    )
    # Halve the baseline's latency: now the run is slower than the baseline by 100%.
    for point in baseline["points"]:
        point["median_ttft"] = point["median_ttft"] / 2
    (project.path / "base.json").write_text(json.dumps(baseline))
    result = project.runpytest("-p", "no:cacheprovider", "--inferbench-baseline=base.json")
    result.assert_outcomes(failed=3)
    result.stdout.re_match_lines(
        [
            r".*median_ttft [\d.]+ s > baseline [\d.]+ s \(\+100\.0%, "
            r"tolerance 5%; base\.json\)"
        ]
    )


def test_malformed_gates_file_stops_the_run_with_file_and_line(project: pytest.Pytester) -> None:
    (project.path / "gates.yaml").write_text("slo:\n  - require: [p99_ttft < 2]\n")
    result = project.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert "gates.yaml:2: operator '<' in 'p99_ttft < 2': use '>=' or '<='" in text
    assert "nothing was run" in text and not (project.path / "inferbench-results").exists()
    assert "Traceback" not in text


def test_without_matplotlib_the_summary_says_why_there_are_no_plots(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = project.runpytest_inprocess("-p", "no:cacheprovider", "-k", "conc1")
    result.assert_outcomes(passed=1, deselected=2)
    result.stdout.fnmatch_lines(["inferbench: no plots: matplotlib is not installed*"])
    assert not (project.path / "inferbench-results" / "plots").exists()
