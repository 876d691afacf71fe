"""`--inferbench-changed-since` on a branch that changed no benchmark: a success that says so.

A PR that touches no master entry, launch spec, benchmark script or changelog has nothing to
run; pytest's own "no tests collected" (exit 5) would fail the CI step that runs the sweep.
"""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

import pytest

from pytest_inferbench.testing.recipes import master_entry

if TYPE_CHECKING:
    from pathlib import Path


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(pytester: pytest.Pytester) -> Path:
    (pytester.path / "bench-master.yaml").write_text(master_entry(isl=256, osl=16))
    (pytester.path / "README.md").write_text("docs\n")
    _git(pytester.path, "init", "-q", "-b", "main")
    _git(pytester.path, "config", "user.email", "dev@example.com")
    _git(pytester.path, "config", "user.name", "dev")
    _git(pytester.path, "add", "-A")
    _git(pytester.path, "commit", "-q", "-m", "base")
    _git(pytester.path, "checkout", "-q", "-b", "docs-only")
    (pytester.path / "README.md").write_text("docs, better\n")
    _git(pytester.path, "commit", "-qam", "docs")
    return pytester.path


def test_nothing_changed_is_a_success_that_says_so(pytester: pytest.Pytester,
                                                    repo: Path) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "--inferbench-changed-since=main")
    assert result.ret == pytest.ExitCode.OK, result.outlines
    result.stdout.fnmatch_lines(["*inferbench: nothing changed since main *no points to run*"])


def test_a_selection_of_nothing_by_the_user_is_still_pytests_exit_5(
        pytester: pytest.Pytester, repo: Path) -> None:
    # Something changed, but -k selects none of it: that is the user's selection, not "nothing
    # changed", and pytest's answer stands.
    text = (repo / "bench-master.yaml").read_text()
    (repo / "bench-master.yaml").write_text(text.replace("isl: 256", "isl: 512"))
    _git(repo, "commit", "-qam", "longer prompts")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "--inferbench-changed-since=main", "-k", "nomatch")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.outlines
    assert "nothing changed" not in result.stdout.str()
