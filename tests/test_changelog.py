"""perf-changelog.yaml checks, including the PR-number rule against a real git base."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

import pytest

from pytest_inferbench.changelog import (
    ChangelogError,
    check_entry,
    known_config_keys,
    load_changelog,
    parse_changelog,
)
from pytest_inferbench.changelog.gate import compute_gate
from pytest_inferbench.testing.recipes import changelog_entry, master_entry

if TYPE_CHECKING:
    from pathlib import Path

MASTER = "".join(
    master_entry(key, ["{ tp: 4, conc-start: 1, conc-end: 1 }"], isl=256, osl=16)
    for key in ("minimaxm3-fp4-mi355x-atom", "minimaxm3-fp4-mi355x-atom-mtp")
)
OLD_ENTRY = changelog_entry(["minimaxm3-fp4-mi355x-atom"], "Add minimaxm3-fp4-mi355x-atom", 1900)
NEW_ENTRY = "\n" + changelog_entry(["minimaxm3-fp4-*-atom-mtp"],
                                   "Add minimaxm3-fp4-mi355x-atom-mtp: EAGLE3, k=3", "{pr}")


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q", "-b", "main")
    git(tmp_path, "config", "user.email", "dev@example.com")
    git(tmp_path, "config", "user.name", "dev")
    (tmp_path / "amd-master.yaml").write_text(MASTER)
    (tmp_path / "perf-changelog.yaml").write_text(OLD_ENTRY)
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "base")
    return tmp_path


def check_all(repo: Path, pr: int, base: str = "main") -> list[list[str]]:
    path = repo / "perf-changelog.yaml"
    changelog = load_changelog(path)
    keys = known_config_keys(repo)
    added = compute_gate(path, base).added
    return [check_entry(e, keys, pr, e.index in added) for e in changelog.entries]


def test_new_entry_linking_another_pr_fails_naming_both(repo: Path) -> None:
    (repo / "perf-changelog.yaml").write_text(OLD_ENTRY + NEW_ENTRY.format(pr=1850))
    old, new = check_all(repo, pr=1917)
    assert old == []  # existing entries are not held to this PR's number
    assert new == [
        "entry at line 7: new entry links PR 1850, but it is added by PR 1917: "
        "use .../pull/1917 or XXX"
    ]


@pytest.mark.parametrize("link", ["1917", "XXX"])
def test_new_entry_linking_this_pr_or_placeholder_passes(repo: Path, link: str) -> None:
    (repo / "perf-changelog.yaml").write_text(OLD_ENTRY + NEW_ENTRY.format(pr=link))
    assert check_all(repo, pr=1917) == [[], []]


def test_unknown_base_revision_is_a_clear_error(repo: Path) -> None:
    with pytest.raises(ChangelogError, match="'origin/nope': no such git revision"):
        compute_gate(repo / "perf-changelog.yaml", "origin/nope")


def test_entry_problems(tmp_path: Path) -> None:
    text = """\
- config-keys: [minimaxm3-fp4-mi355x-atom, nosuch-key, gptoss-*]
  description: []
  pr-link: https://github.com/someone/fork/pull/3
  colour: blue
"""
    changelog = parse_changelog(text, tmp_path / "perf-changelog.yaml")
    (entry,) = changelog.entries
    failures = check_entry(entry, {"minimaxm3-fp4-mi355x-atom"}, None, added=True)
    where = tmp_path / "perf-changelog.yaml"
    assert failures == [
        f"{where}:4: unknown field 'colour'",
        f"{where}:1: description must be a non-empty list of lines",
        "entry at line 1: config key 'nosuch-key' not found in master configs",
        "entry at line 1: no config keys matched the wildcard pattern 'gptoss-*' in master configs",
        "entry at line 1: pr-link 'https://github.com/someone/fork/pull/3' is not a link to a "
        "PR (https://github.com/SemiAnalysisAI/InferenceX/pull/N) or XXX",
    ]


def test_file_must_end_with_newline(tmp_path: Path) -> None:
    changelog = parse_changelog(OLD_ENTRY.rstrip("\n"), tmp_path / "c.yaml")
    assert changelog.problems == (f"{tmp_path / 'c.yaml'}: the file must end with a newline",)
    assert parse_changelog(OLD_ENTRY, tmp_path / "c.yaml").problems == ()


def test_changelog_items_in_a_plugin_run(pytester: pytest.Pytester) -> None:
    repo = pytester.path
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "dev@example.com")
    git(repo, "config", "user.name", "dev")
    (repo / "amd-master.yaml").write_text(MASTER)
    (repo / "perf-changelog.yaml").write_text(OLD_ENTRY)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "perf-changelog.yaml").write_text(OLD_ENTRY + NEW_ENTRY.format(pr=1850))
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "-m",
        "changelog",
        "--inferbench-pr",
        "1917",
        "--inferbench-changelog-base",
        "main",
    )
    # The history check and the old entry pass; the added entry fails for its link alone
    # (it reruns a config the branch leaves alone, which InferenceX accepts).
    result.assert_outcomes(passed=2, failed=1, deselected=2)
    result.stdout.fnmatch_lines(
        [
            "*new entry links PR 1850, but it is added by PR 1917*",
            "FAILED perf-changelog.yaml::entry2 - *",
        ]
    )
    result.stdout.no_fnmatch_line("*is not changed since*")
    # Without --inferbench-pr the PR rule is not applied; the entry is otherwise valid.
    pytester.runpytest("-p", "no:cacheprovider", "-m", "changelog").assert_outcomes(
        passed=2, deselected=2
    )


def test_historical_entries_are_not_held_to_live_config_keys(tmp_path: Path) -> None:
    text = OLD_ENTRY.replace("- minimaxm3-fp4-mi355x-atom\n", "- since-deprecated-config\n")
    (entry,) = parse_changelog(text, tmp_path / "perf-changelog.yaml").entries
    assert check_entry(entry, {"minimaxm3-fp4-mi355x-atom"}, 1900, added=False) == []
    assert check_entry(entry, {"minimaxm3-fp4-mi355x-atom"}, 1900, added=True) == [
        "entry at line 1: config key 'since-deprecated-config' not found in master configs"]


# InferenceX's perf-changelog.yaml holds an entry whose link ends in `/changes` (PR 2305): its
# validator judges only the lines a change adds, so that entry never fails a later change.
ODD_LINK_ENTRY = changelog_entry(["minimaxm3-fp4-mi355x-atom"], "Add the MTP variant",
                                 "2305/changes")


def test_an_untouched_entry_with_an_odd_link_is_never_rejudged(pytester: pytest.Pytester) -> None:
    repo = pytester.path
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "dev@example.com")
    git(repo, "config", "user.name", "dev")
    (repo / "amd-master.yaml").write_text(MASTER)
    (repo / "perf-changelog.yaml").write_text(OLD_ENTRY + "\n" + ODD_LINK_ENTRY)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base")
    (repo / "perf-changelog.yaml").write_text(OLD_ENTRY + "\n" + ODD_LINK_ENTRY
                                              + NEW_ENTRY.format(pr=1917))
    gate = ("-p", "no:cacheprovider", "-m", "changelog", "perf-changelog.yaml")
    pr_run = pytester.runpytest(*gate, "--inferbench-pr", "1917",
                                "--inferbench-changelog-base", "main")
    pr_run.assert_outcomes(passed=4)  # the history and the three entries
    # Without a base every entry is held to the schema alone, as InferenceX's parser holds it.
    pytester.runpytest(*gate).assert_outcomes(passed=3)
    # The same link on an entry the branch adds is a link to PR 2305's page, which InferenceX's
    # sweep validator accepts; a link that is not a PR's fails, naming it.
    (repo / "perf-changelog.yaml").write_text(OLD_ENTRY + "\n" + ODD_LINK_ENTRY + "\n"
                                              + ODD_LINK_ENTRY)
    pytester.runpytest(*gate, "--inferbench-changelog-base", "main").assert_outcomes(passed=4)
    (repo / "perf-changelog.yaml").write_text(
        OLD_ENTRY + "\n" + ODD_LINK_ENTRY + "\n"
        + changelog_entry(["minimaxm3-fp4-mi355x-atom"], "Add the MTP variant", "2305/../1"))
    added_run = pytester.runpytest(*gate, "--inferbench-changelog-base", "main")
    added_run.assert_outcomes(passed=3, failed=1)
    added_run.stdout.fnmatch_lines(["*pr-link '*/pull/2305/../1' is not a link to a PR*"])


@pytest.mark.parametrize("fields, problem", [
    ("  append-only: true\n", None),
    ("  append-only: false\n  evals-only: true\n", None),
    ("  eval-min-prefill-ep: 8\n  all-evals: true\n", None),
    ("  scenario-type: [agentic-coding]\n  append-only: true\n", None),
    ("  append-only: true\n  evals-only: true\n",
     "append-only cannot be combined with evals-only, all-evals or eval-min-prefill-ep"),
    ("  append-only: true\n  eval-min-prefill-ep: 4\n",
     "append-only cannot be combined with evals-only, all-evals or eval-min-prefill-ep"),
    ("  append-only: yes please\n", "append-only must be true or false"),
    ("  eval-min-prefill-ep: 0\n", "eval-min-prefill-ep must be a whole number of at least 1"),
    ("  eval-min-prefill-ep: true\n",
     "eval-min-prefill-ep must be a whole number of at least 1"),
    ("  scenario-type: [1k1k]\n",
     "scenario-type must be a non-empty list of fixed-seq-len / agentic-coding"),
    ("  scenario-type: []\n",
     "scenario-type must be a non-empty list of fixed-seq-len / agentic-coding"),
])
def test_optional_fields_as_inferencex_types_them(tmp_path: Path, fields: str,
                                                  problem: str | None) -> None:
    path = tmp_path / "perf-changelog.yaml"
    (entry,) = parse_changelog(OLD_ENTRY + fields, path).entries
    failures = check_entry(entry, {"minimaxm3-fp4-mi355x-atom"}, None, added=True)
    assert failures == ([] if problem is None else [f"{path}:1: {problem}"])


def test_scenario_type_is_kept_for_selection(tmp_path: Path) -> None:
    text = OLD_ENTRY + "  scenario-type:\n    - agentic-coding\n"
    (entry,) = parse_changelog(text, tmp_path / "perf-changelog.yaml").entries
    assert entry.scenario_types == ("agentic-coding",)


@pytest.mark.parametrize("separator, ok", [(b"\n", True), (b" \n", True), (b"  \n\n", True),
                                           (b"", False)])
def test_a_separator_line_of_spaces_is_one_empty_line(separator: bytes, ok: bool) -> None:
    # InferenceX's history appends entries after a line holding one space, and after a line of
    # spaces followed by an empty line; its sweep validator accepted them. None is no separator.
    from pytest_inferbench.changelog.history import check_history

    base = OLD_ENTRY.encode()
    history = check_history(base, base + separator + NEW_ENTRY.format(pr=1917)[1:].encode())
    assert (history.failures == []) is ok, history.failures
