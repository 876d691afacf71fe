"""The changelog gate and `--inferbench-changed-since` against hostile git histories and a hostile
git: a changelog new on the branch or empty at the base, a base recipe that is not YAML or not
UTF-8, git missing from PATH, git that never answers. Each run ends with its outcome or a clear
message naming the cause, never a traceback or INTERNALERROR, and never waits for ever."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from pytest_inferbench.changelog.changes import GitError, run_git
from pytest_inferbench.changelog.history import check_history
from pytest_inferbench.testing.recipes import changelog_entry, master_entry

if TYPE_CHECKING:
    from pathlib import Path

KEYS = ("minimaxm3-fp4-mi355x-atom", "minimaxm3-fp4-mi355x-atom-mtp")
MASTER = "".join(master_entry(key, ["{ tp: 4, conc-start: 1, conc-end: 1 }"], isl=256, osl=16)
                 for key in KEYS)
OLD_ENTRY = changelog_entry([KEYS[0]], f"Add {KEYS[0]}", 1900)
NEW_ENTRY = changelog_entry([KEYS[1]], f"Tune {KEYS[1]}", "XXX")


@dataclass(frozen=True)
class Case:
    """A base commit, the branch's working tree on top of it, and how a run must end."""

    name: str
    base_master: str | bytes | None  # amd-master.yaml at the base (None: as on the branch)
    base_changelog: str | None  # perf-changelog.yaml at the base (None: not there)
    git: str = "real"  # real, missing (no git on PATH) or hung (a git that never answers)
    head_changelog: str | None = None  # the branch's entries before its new one (None: the
    # base's)
    message: str | None = None  # None: the run passes; else every failure says this
    # The gate never reads master files (an added entry may rerun an unchanged config), so a
    # base master file that cannot be read troubles only --inferbench-changed-since.
    recipe_only: bool = False


CASES = [
    Case("changelog-new-on-branch", None, None),
    Case("changelog-empty-at-base", None, ""),
    Case("base-recipe-bad-yaml", MASTER.replace("{ tp: 4,", "{ tp: [4,", 1), OLD_ENTRY,
         message="amd-master.yaml at revision main: line 14: not readable YAML", recipe_only=True),
    Case("base-recipe-not-utf8", MASTER.encode().replace(b"MiniMax", b"Mini\xffMax", 1),
         OLD_ENTRY, message="amd-master.yaml at revision main: line 2: not UTF-8 text",
         recipe_only=True),
    Case("base-changelog-bad-yaml", None, OLD_ENTRY.replace("description:", "description: [",
                                                            1), head_changelog=OLD_ENTRY,
         message="perf-changelog.yaml at revision main: line 4: not readable YAML"),
    Case("git-missing", None, OLD_ENTRY, git="missing",
         message="is git installed and on PATH?"),
    Case("git-hangs", None, OLD_ENTRY, git="hung",
         message="rev-parse --show-toplevel: no answer within 0.5 s (git hangs"),
]


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True)


def _branch(repo: Path, case: Case, monkeypatch: pytest.MonkeyPatch, bin_dir: Path) -> None:
    """The base commit on `main`, the branch's changes in the working tree, and the git the
    run will find on PATH."""
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "dev@example.com")
    _git(repo, "config", "user.name", "dev")
    master = repo / "amd-master.yaml"
    base = MASTER if case.base_master is None else case.base_master
    master.write_bytes(base if isinstance(base, bytes) else base.encode())
    if case.base_changelog is not None:
        (repo / "perf-changelog.yaml").write_text(case.base_changelog)
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "base")
    # The branch: the mtp config changed, and a changelog entry naming it appended.
    master.write_text(MASTER.replace("conc-end: 1 }", "conc-end: 2 }"))
    kept = case.base_changelog if case.head_changelog is None else case.head_changelog
    before = (kept + "\n") if kept else ""
    (repo / "perf-changelog.yaml").write_text(before + NEW_ENTRY)
    if case.git == "hung":
        # A shell that waits on a child: a timeout that killed only the shell would still
        # wait for the child, which holds the output pipes.
        fake = bin_dir / "git"
        fake.write_text("#!/bin/sh\nsleep 300\n")
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    elif case.git == "missing":
        monkeypatch.setenv("PATH", str(bin_dir))


def _run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, str]:
    # pytest-benchmark asks git for the project name at startup, with no time limit.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:benchmark",
                                           "-m", "changelog",
                                           "-o", "inferbench_git_timeout=0.5", *args,
                                           timeout=120)
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text, text
    return result, text


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_changelog_gate(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                        tmp_path: Path, case: Case) -> None:
    _branch(pytester.path, case, monkeypatch, tmp_path)
    result, text = _run(pytester, "--inferbench-changelog-base=main")
    entries = (pytester.path / "perf-changelog.yaml").read_text().count("- config-keys:")
    outcomes = result.parseoutcomes()
    if case.message is None or case.recipe_only:
        assert result.ret == pytest.ExitCode.OK, text
        assert outcomes.get("passed") == 1 + entries, text  # the history and every entry
    else:
        # The history item and every entry (each asks whether the branch added it) say why.
        assert result.ret == pytest.ExitCode.TESTS_FAILED, text
        assert outcomes.get("failed") == 1 + entries and "passed" not in outcomes, text
        assert text.count(case.message) >= 1 + entries, text


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_changed_since(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                       tmp_path: Path, case: Case) -> None:
    _branch(pytester.path, case, monkeypatch, tmp_path)
    result, text = _run(pytester, "--inferbench-changed-since=main")
    if case.message is None:
        # Only the appended entry is selected, and it passes.
        assert result.ret == pytest.ExitCode.OK, text
        assert result.parseoutcomes().get("passed") == 1, text
    else:
        assert result.ret == pytest.ExitCode.USAGE_ERROR, text
        assert "--inferbench-changed-since main: " in text and case.message in text, text


@pytest.mark.parametrize("base", [b"", b"# nothing yet\n"], ids=["empty", "comment-only"])
def test_history_of_a_changelog_without_entries_at_the_base(base: bytes) -> None:
    head = base + (b"\n" if base else b"") + NEW_ENTRY.encode()
    history = check_history(base, head)
    assert history.added == {0} and history.failures == []


def test_every_git_failure_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(GitError, match=r"git -C .* cat-file blob HEAD:nope failed \(exit "
                                       r"status 128\): fatal: not a git repository"):
        run_git(tmp_path, "cat-file", "blob", "HEAD:nope")


@pytest.mark.parametrize("value, message", [
    ("0", "inferbench_git_timeout 0: expected a finite number of seconds > 0"),
    ("nan", "inferbench_git_timeout nan: expected a finite number of seconds > 0"),
    ("soon", "inferbench_git_timeout = 'soon': not a number of seconds"),
])
def test_a_bad_git_timeout_is_a_usage_error(pytester: pytest.Pytester, value: str,
                                            message: str) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:benchmark",
                                           "-o", f"inferbench_git_timeout={value}")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert message in text and "Traceback" not in text, text
