"""PR #1917 rebuilt in a git repository: the changelog gate passes it and fails each variant.

The base commit is InferenceX at the PR's parent (the PR's diff reversed); the branch applies the
PR's diff (master file, two server scripts) and appends its changelog entry at the end of the
file, as the PR branch did before it was merged. On main the entry landed in the middle of the
file (later PRs were appended first), which is exactly the mid-file variant below.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import copy_checkout

CHANGELOG = "perf-changelog.yaml"
GATE = ("-p", "no:cacheprovider", "-q", "-rf", "--inferbench-changelog-base", "main",
        CHANGELOG)


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def added_entry(patch: str) -> str:
    """The changelog entry the PR adds, from its diff."""
    hunk = patch[patch.index("+++ b/perf-changelog.yaml"):]
    added = [line[1:] for line in hunk.splitlines() if line.startswith("+") and
             not line.startswith("+++")]
    return "\n".join(added).strip("\n") + "\n"


@pytest.fixture(scope="module")
def pr_repo(inferencex_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = copy_checkout(inferencex_dir, tmp_path_factory.mktemp("pr1917") / "InferenceX")
    patch = repo / "pr1917" / "pr1917.patch"
    patch_text = patch.read_text(encoding="utf-8")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "dev@example.com")
    git(repo, "config", "user.name", "dev")
    git(repo, "apply", "-R", str(patch))  # the parent commit's files
    assert (repo / CHANGELOG).read_bytes() == (repo / "perf-changelog.parent.yaml").read_bytes()
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "parent of #1917")
    git(repo, "checkout", "-q", "-b", "pr1917")
    git(repo, "apply", str(patch))
    parent = (repo / "perf-changelog.parent.yaml").read_text(encoding="utf-8")
    (repo / CHANGELOG).write_text(parent + "\n" + added_entry(patch_text), encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "#1917")
    return repo


def run_gate(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", *GATE, *args], cwd=repo,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "1000"})  # untruncated summary


def failure_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("FAILED ")]


def test_the_pr_passes_and_history_never_fails(pr_repo: Path) -> None:
    result = run_gate(pr_repo, "--inferbench-pr", "1917")
    assert result.returncode == 0, result.stdout[-3000:]
    entries = (pr_repo / CHANGELOG).read_text(encoding="utf-8").count("\n- config-keys:") + 1
    # Every entry (historical ones naming configs deprecated since included) and the history.
    assert f"{entries + 1} passed" in result.stdout.splitlines()[-1]


@pytest.fixture
def variant(pr_repo: Path):  # type: ignore[no-untyped-def]
    original = (pr_repo / CHANGELOG).read_bytes()

    def write(text: str) -> None:
        (pr_repo / CHANGELOG).write_text(text, encoding="utf-8")

    yield write
    (pr_repo / CHANGELOG).write_bytes(original)


def test_wrong_pr_number(pr_repo: Path) -> None:
    (failed,) = failure_lines(run_gate(pr_repo, "--inferbench-pr", "1918"))
    assert "new entry links PR 1917, but it is added by PR 1918" in failed


def test_entry_inserted_mid_file(pr_repo: Path, inferencex_dir: Path, variant) -> None:  # type: ignore[no-untyped-def]
    # The file as merged on main: the PR's entry sits before entries of later PRs.
    variant((inferencex_dir / CHANGELOG).read_text(encoding="utf-8"))
    (failed,) = failure_lines(run_gate(pr_repo, "--inferbench-pr", "1917"))
    assert failed.startswith("FAILED perf-changelog.yaml::history - entry at line 3987 "
                             "(minimaxm3-fp4-mi355x-atom, minimaxm3-fp4-mi355x-atom-mtp): "
                             "inserted in the middle of the history")


def test_added_entry_rerunning_a_config_not_in_the_diff(pr_repo: Path, variant) -> None:  # type: ignore[no-untyped-def]
    # InferenceX accepts a changelog entry that reruns a config the diff leaves alone (its
    # history has changelog-only changes that recover a sweep), so the gate does too.
    text = (pr_repo / CHANGELOG).read_text(encoding="utf-8")
    variant(text.replace("    - minimaxm3-fp4-mi355x-atom-mtp\n  description:",
                         "    - minimaxm3-fp4-mi355x-atom-mtp\n    - minimaxm3-fp8-mi355x-atom\n"
                         "  description:"))
    result = run_gate(pr_repo, "--inferbench-pr", "1917")
    assert result.returncode == 0 and failure_lines(result) == [], result.stdout[-3000:]


def test_reformatted_old_entry(pr_repo: Path, variant) -> None:  # type: ignore[no-untyped-def]
    text = (pr_repo / CHANGELOG).read_text(encoding="utf-8")
    # The first entry's pr-link quoted: the same YAML data, other bytes.
    start = text.index("  pr-link: ") + len("  pr-link: ")
    end = text.index("\n", start)
    variant(text[:start] + f'"{text[start:end]}"' + text[end:])
    (failed,) = failure_lines(run_gate(pr_repo, "--inferbench-pr", "1917"))
    assert failed.startswith("FAILED perf-changelog.yaml::history - entry at line 1 (")
    assert failed.endswith("reformatted; existing entries are immutable byte for byte")


def test_changed_since_selects_exactly_the_nodes_the_pr_touched(pr_repo: Path) -> None:
    def collect(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
             "--inferbench-changed-since", "main", *args],
            cwd=pr_repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def ids_of(run: subprocess.Popen[str]) -> list[str]:
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, out[-3000:] + err[-3000:]
        return [line for line in out.splitlines() if "::" in line]

    # Both collections of the whole checkout at once: they read the same commit, nothing more.
    runs = collect(), collect("-k", "mtp")
    ids, mtp_ids = (ids_of(run) for run in runs)
    nodes = {i.rsplit("::", 1)[0] for i in ids if i.startswith(".github/")}
    # The two MiniMax-M3 MXFP4 MI355X ATOM configs the PR changed (plain and EAGLE3).
    assert nodes == {".github/configs/amd-master.yaml::minimaxm3-fp4-mi355x-atom-tp4",
                     ".github/configs/amd-master.yaml::minimaxm3-fp4-mi355x-atom-mtp-tp4"}
    changelog_items = [i for i in ids if i.startswith(CHANGELOG)]
    entries = (pr_repo / CHANGELOG).read_text(encoding="utf-8").count("\n- config-keys:") + 1
    assert changelog_items == [f"{CHANGELOG}::entry{entries}"]  # only the entry the PR added
    # Composable with -k (the added changelog entry names the mtp config, so it stays).
    assert {i.rsplit("::", 1)[0] for i in mtp_ids} == {
        ".github/configs/amd-master.yaml::minimaxm3-fp4-mi355x-atom-mtp-tp4", CHANGELOG}
