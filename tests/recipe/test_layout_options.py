"""Where recipes, changelog and thresholds live, named by ini options outside InferenceX."""

from __future__ import annotations

import json

import pytest

from pytest_inferbench.testing.recipes import changelog_entry, master_entry

CHANGELOG = changelog_entry(["k-fp4-mi355x-atom"], "Add k", 1)


def collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", *args)
    return [line for line in result.outlines if "::" in line]


def test_recipe_dir_changelog_and_thresholds_from_ini(pytester: pytest.Pytester) -> None:
    hidden = pytester.path / ".bench"
    hidden.mkdir()
    (hidden / "amd-master.yaml").write_text(master_entry("k-fp4-mi355x-atom"))
    # Retired configs, as InferenceX keeps them: left out unless asked for.
    (hidden / "deprecated").mkdir()
    (hidden / "deprecated" / "old-master.yaml").write_text(master_entry("old-fp4-mi355x-atom"))
    (pytester.path / "docs").mkdir()
    (pytester.path / "docs" / "perf-changelog.yaml").write_text(CHANGELOG)
    (pytester.path / "limits.json").write_text(json.dumps({"default": {"gsm8k": 0.5}}))
    # pytest skips dot-directories: without the option nothing is collected.
    assert collected(pytester) == []
    pytester.makeini("[pytest]\ninferbench_recipe_dirs = .bench\n"
                     "inferbench_changelog = docs/perf-changelog.yaml\n"
                     "inferbench_eval_thresholds = limits.json\n")
    assert collected(pytester) == [
        ".bench/amd-master.yaml::k-fp4-mi355x-atom-tp4::isl1024-osl1024-conc1",
        # The thresholds file asks for evals; the changelog is checked against .bench.
        ".bench/amd-master.yaml::k-fp4-mi355x-atom-tp4::eval-gsm8k",
        "docs/perf-changelog.yaml::entry1",
    ]
    result = pytester.runpytest("-p", "no:cacheprovider", "-q", "-m", "changelog")
    result.assert_outcomes(passed=1, deselected=2)
    pytester.makeini("[pytest]\ninferbench_recipe_dirs = .bench\n"
                     "inferbench_include_deprecated = true\n")
    assert [n for n in collected(pytester) if "deprecated" in n] == [
        ".bench/deprecated/old-master.yaml::old-fp4-mi355x-atom-tp4::isl1024-osl1024-conc1"]


def test_a_path_option_given_as_two_words_is_refused_before_rootdir_moves(
        pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory) -> None:
    (pytester.path / "amd-master.yaml").write_text(master_entry("k-fp4-mi355x-atom"))
    pytester.makeini("[pytest]\n")
    data = tmp_path_factory.mktemp("gsm8k") / "test.jsonl"
    data.write_text("{}\n")
    result = pytester.runpytest("--collect-only", "-q", "--inferbench-eval-data", str(data))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--inferbench-eval-data {data}: pytest takes {data} for a test "
                                 f"path*write --inferbench-eval-data={data}"])
    assert not (data.parent / ".pytest_cache").exists()
    # The one-word form, a path inside the current directory and a value that is no path on
    # disk leave the rootdir where it was.
    assert collected(pytester, f"--inferbench-eval-data={data}") != []
    (pytester.path / "test.jsonl").write_text("{}\n")
    assert collected(pytester, "--inferbench-eval-data", "test.jsonl") != []
    assert collected(pytester, "--inferbench-seed", "3") != []


def test_a_split_path_is_reported_with_the_other_option_problems(
        pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory) -> None:
    (pytester.path / "amd-master.yaml").write_text(master_entry("k-fp4-mi355x-atom"))
    pytester.makeini("[pytest]\n")
    data = tmp_path_factory.mktemp("gsm8k") / "test.jsonl"
    data.write_text("{}\n")
    result = pytester.runpytest("--collect-only", "-q", "--inferbench-eval-data", str(data),
                                "--inferbench-max-failure-ratio=5")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*2 problems in the inferbench options, nothing was run:",
                                 f"*--inferbench-eval-data {data}: pytest takes*",
                                 "*--inferbench-max-failure-ratio*"])
