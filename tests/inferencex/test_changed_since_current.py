"""`--inferbench-changed-since` in a git copy of InferenceX's current tree (`configs/`, its
deprecated archive, `benchmarks/` with one script directory per scenario): exactly the points
that a change starts differently are selected, and deprecated configs only when asked for.

The copy holds AMD's live master file, its archived 1k1k file (which repeats many live config
keys) and every benchmark script, so each case collects a few thousand points in process.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_inferbench.recipe.schema import load_recipe

from .test_changelog_replay import current_source

LIVE = "configs/amd-master.yaml"
ARCHIVED = "configs/deprecated/amd-1k1k-master.yaml"
COPIED = (LIVE, ARCHIVED, "benchmarks", "perf-changelog.yaml")
CONFIG = "kimik2.5-fp4-mi355x-vllm"  # live and archived: fixed-seq-len points
AGENTIC_CONFIG = "kimik2.5-fp4-mi355x-vllm-agentic"  # its agentic sibling, same script stem
AGENTIC_SCRIPT = "benchmarks/single_node/agentic/kimik2.5_fp4_mi355x.sh"
FIXED_SCRIPT = "benchmarks/single_node/fixed_seq_len/kimik2.5_fp4_mi355x.sh"


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(pytester: pytest.Pytester) -> Path:
    source = current_source()
    if not (source / LIVE).is_file():
        pytest.skip(f"no current InferenceX tree at {source} "
                    "(set INFERBENCH_INFERENCEX_CURRENT_DIR)")
    for name in COPIED:
        target = pytester.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (source / name).is_dir():
            shutil.copytree(source / name, target)
        else:
            shutil.copyfile(source / name, target)
    git(pytester.path, "init", "-q", "-b", "main")
    git(pytester.path, "config", "user.email", "dev@example.com")
    git(pytester.path, "config", "user.name", "dev")
    git(pytester.path, "add", "-A")
    git(pytester.path, "commit", "-q", "-m", "base")
    return pytester.path


def selected(pytester: pytest.Pytester, *paths: str) -> set[str]:
    result = pytester.runpytest("-p", "no:cacheprovider", "--collect-only", "-q",
                                "--inferbench-changed-since=main", *paths)
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED), result.outlines
    return {line for line in result.outlines if "::" in line and "perf-changelog" not in line}


def points(repo: Path, recipe: str, config: str, scenario: str | None = None) -> set[str]:
    """The ids of a config's points, from the recipe parser (the collection's own source)."""
    name = recipe
    return {f"{name}::{server.node_name}::{point.name}"
            for server in load_recipe(repo / recipe, strict=False).servers
            if server.config_key == config and scenario in (None, server.scenario)
            for point in server.points()}


def append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text)


def test_an_agentic_script_selects_only_its_agentic_points(pytester: pytest.Pytester,
                                                           repo: Path) -> None:
    append(repo / AGENTIC_SCRIPT, "# tuned\n")
    chosen = selected(pytester, "configs")
    expected = points(repo, LIVE, AGENTIC_CONFIG, "agentic-coding")
    assert expected and chosen == expected
    # The fixed-seq-len points of the same script stem, live or archived, are not among them.
    assert points(repo, LIVE, CONFIG, "fixed-seq-len")
    assert not chosen & points(repo, LIVE, CONFIG, "fixed-seq-len")


def test_a_fixed_seq_len_script_selects_live_points_and_archived_ones_only_when_asked(
        pytester: pytest.Pytester, repo: Path) -> None:
    append(repo / FIXED_SCRIPT, "# tuned\n")
    live = points(repo, LIVE, CONFIG, "fixed-seq-len")
    archived = points(repo, ARCHIVED, CONFIG)
    assert live and archived
    assert selected(pytester, "configs") == live  # the archive is never selected by default
    assert selected(pytester, ARCHIVED) == archived  # named on the command line: asked for


def test_one_config_entry_selects_only_its_points(pytester: pytest.Pytester,
                                                  repo: Path) -> None:
    master = repo / LIVE
    text = master.read_text(encoding="utf-8")
    start = text.index(f"\n{CONFIG}:\n")
    image = text.index("  image: ", start)
    end = text.index("\n", image)
    master.write_text(text[:end] + "-rebuilt" + text[end:], encoding="utf-8")
    # Every scenario of the one entry; not the archived entry of the same key.
    assert selected(pytester, "configs") == points(repo, LIVE, CONFIG)


def test_an_added_changelog_entry_reruns_its_configs_within_its_scenario_type(
        pytester: pytest.Pytester, repo: Path) -> None:
    # A changelog-only change: the wildcard names both configs, the scenario-type one of them.
    append(repo / "perf-changelog.yaml", "\n- config-keys:\n    - kimik2.5-fp4-mi355x-vllm*\n"
           "  scenario-type:\n    - agentic-coding\n  description:\n    - \"Rerun\"\n"
           "  pr-link: XXX\n")
    chosen = selected(pytester, "configs", "perf-changelog.yaml")
    assert chosen == points(repo, LIVE, AGENTIC_CONFIG, "agentic-coding")
