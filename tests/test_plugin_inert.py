"""Installed but unused, the plugin leaves pytest runs as they were; used, it cleans up after."""

from __future__ import annotations

import re
import shutil
import signal
from pathlib import Path

import pytest

from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[1]

PLAIN_TESTS = """
import signal


def test_sigterm_keeps_its_default_handler():
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_no_report_collector(request):
    assert request.config.pluginmanager.get_plugin("inferbench-report") is None


def test_a_failure_reads_the_same():
    assert 1 + 1 == 3
"""


def normalized(lines: list[str]) -> list[str]:
    """Output lines without the run time and without this plugin's name in the plugins line."""
    out = []
    for line in lines:
        line = re.sub(r" in \d+\.\d+s", " in Ns", line)
        if line.startswith("plugins:"):
            line = re.sub(r"inferbench-[^,\s]+(, )?", "", line).rstrip(", ")
        out.append(line)
    return out


def test_a_project_without_recipes_sees_pytest_unchanged(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain=PLAIN_TESTS)
    used = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    unused = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:inferbench")
    used.assert_outcomes(passed=2, failed=1)
    unused.assert_outcomes(passed=2, failed=1)
    assert normalized(used.outlines) == normalized(unused.outlines)
    assert not any("inferbench" in line for line in used.outlines if
                   not line.startswith("plugins:"))


def test_an_inferbench_option_engages_the_plugin(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-seed", "1")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["inferbench: backend sim, results in inferbench-results/",
                                 "inferbench: SIMULATED results*"])


@pytest.mark.parametrize(("ini", "engaged"), [
    ("inferbench_results = elsewhere", True),
    ("inferbench_backend = sim", False),  # the default value: as if unset
])
def test_an_ini_value_engages_the_plugin_when_it_differs_from_the_default(
        pytester: pytest.Pytester, ini: str, engaged: bool) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_plain="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert any(line.startswith("inferbench: backend") for line in result.outlines) is engaged


def test_a_recipe_run_prints_the_header_and_restores_sigterm(pytester: pytest.Pytester) -> None:
    (pytester.path / "bench-master.yaml").write_text(
        master_entry(rows=["{ tp: 4, conc-list: [1] }"], isl=64, osl=8))
    (pytester.path / "launch").mkdir()
    shutil.copy(REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml", pytester.path / "launch")
    pytester.makepyfile(test_plain=(
        "import signal\n\n"
        "def test_sigterm_is_mapped_while_recipes_run():\n"
        "    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL\n"))
    before = signal.getsignal(signal.SIGTERM)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert signal.getsignal(signal.SIGTERM) is before
    # Engaged by the recipe alone: the header comes right after collection.
    result.stdout.fnmatch_lines(["collected 2 items", "inferbench: backend sim*",
                                 "inferbench: SIMULATED results*",
                                 "inferbench: 1 server nodes, 1 benchmark points"])
