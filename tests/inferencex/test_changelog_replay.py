"""The last 50 entries of InferenceX's current perf-changelog.yaml replayed as 50 pull requests,
each judged by InferenceX's own validator (run as its workflow runs it) and by the plugin's gate.

The reference tree (`../shared/inferencex-0801`) has no git history, so the history is rebuilt:
the base commit holds the changelog without those entries, and each later commit appends one
entry and edits the master entries of the configs it names (their image), as the PR did. A
sample of the commits is judged (each validator run generates the PR's sweep matrix): the
commit after the entry whose link ends in `/changes` among them, where the gate used to fail an
entry no commit touched.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from .conftest import REPO

CHANGELOG = "perf-changelog.yaml"
REPLAYED = 50
# What InferenceX's check-changelog job needs: its validator, the changelog processor it runs,
# the matrix generator and the master configs.
COPIED = ("configs", "utils/validate_perf_changelog.py", "utils/process_changelog.py",
          "utils/constants.py", "utils/matrix_logic/validation.py",
          "utils/matrix_logic/generate_sweep_configs.py", CHANGELOG)
ENTRY_START = re.compile(r"(?m)^- config-keys:")
CANONICAL = re.compile(r"https://github\.com/SemiAnalysisAI/InferenceX/pull/(\d+)")
IMAGE_LINE = re.compile(r"^(  image:\s*)(\"?)([^\"\n]*)(\"?)$")


def current_source() -> Path:
    return Path(os.environ.get("INFERBENCH_INFERENCEX_CURRENT_DIR")
                or REPO.parent / "shared" / "inferencex-0801")


@dataclass(frozen=True)
class Commit:
    sha: str
    parent: str
    entry: dict[str, object]  # the entry it appends

    @property
    def pr(self) -> str:
        found = re.search(r"/pull/(\d+)", str(self.entry.get("pr-link", "")))
        return found.group(1) if found else ""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def touch_configs(repo: Path, keys: list[str], tag: str) -> None:
    """Edit the image of each named master entry, as a PR that changes those configs does."""
    for master in sorted((repo / "configs").glob("*-master.yaml")):
        lines = master.read_text(encoding="utf-8").split("\n")
        names = [line[:-1] for line in lines if re.fullmatch(r"[^\s#][^:]*:", line)]
        wanted = {name for name in names for key in keys
                  if re.fullmatch(re.escape(key).replace(r"\*", ".*"), name)}
        current = None
        for i, line in enumerate(lines):
            if re.fullmatch(r"[^\s#][^:]*:", line):
                current = line[:-1]
            elif current in wanted and IMAGE_LINE.match(line):
                lines[i] = IMAGE_LINE.sub(rf"\g<1>\g<2>\g<3>-{tag}\g<4>", line)
                wanted.discard(current)
        master.write_text("\n".join(lines), encoding="utf-8")


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Commit]]:
    pytest.importorskip("pydantic")  # InferenceX's validator needs it
    source = current_source()
    if not (source / "configs" / "amd-master.yaml").is_file():
        pytest.skip(f"no current InferenceX tree at {source} "
                    "(set INFERBENCH_INFERENCEX_CURRENT_DIR)")
    repo = tmp_path_factory.mktemp("replay") / "InferenceX"
    for name in COPIED:
        target = repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (source / name).is_dir():
            shutil.copytree(source / name, target)
        else:
            shutil.copyfile(source / name, target)
    text = (repo / CHANGELOG).read_text(encoding="utf-8")
    starts = [m.start() for m in ENTRY_START.finditer(text)]
    first = len(starts) - REPLAYED
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "dev@example.com")
    git(repo, "config", "user.name", "dev")

    def commit(upto: int, message: str) -> str:
        # The file up to the start of entry `upto`, ending as InferenceX's file ends.
        (repo / CHANGELOG).write_text(text[:starts[upto]].rstrip("\n") + "\n"
                                      if upto < len(starts) else text, encoding="utf-8")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", message)
        return git(repo, "rev-parse", "HEAD")

    parent = commit(first, "base")
    commits = []
    for index in range(first, len(starts)):
        end = starts[index + 1] if index + 1 < len(starts) else len(text)
        entry = yaml.safe_load(text[starts[index]:end])[0]
        touch_configs(repo, [str(k) for k in entry["config-keys"]], f"r{index}")
        sha = commit(index + 1, f"entry {index + 1}")
        commits.append(Commit(sha, parent, entry))
        parent = sha
    return repo, commits


def sample(commits: list[Commit]) -> list[Commit]:
    """The first commit (its entry follows a separator line holding a space), the last, and
    those adding or following an entry whose link is not canonical."""
    odd = [i for i, c in enumerate(commits)
           if not CANONICAL.fullmatch(str(c.entry.get("pr-link", "")))]
    wanted = {0, len(commits) - 1, *odd, *(i + 1 for i in odd if i + 1 < len(commits))}
    return [commits[i] for i in sorted(wanted)]


def validator(worktree: Path, commit: Commit) -> subprocess.Popen[str]:
    """`check-changelog` of run-sweep.yml, started: the validator at the repository root,
    against the PR's base and head."""
    return subprocess.Popen(
        [sys.executable, "utils/validate_perf_changelog.py", "--changelog-file", CHANGELOG,
         "--base-ref", commit.parent, "--head-ref", commit.sha],
        cwd=worktree, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_replayed_history_passes_the_gate_wherever_inferencex_does(
        history: tuple[Path, list[Commit]], pytester: pytest.Pytester,
        monkeypatch: pytest.MonkeyPatch) -> None:
    repo, commits = history
    # INFERBENCH_REPLAY_ALL=1 judges all of them (minutes: each validator run generates a matrix).
    judged = commits if os.environ.get("INFERBENCH_REPLAY_ALL") == "1" else sample(commits)
    worktrees = [repo.parent / f"pr{number}" for number in range(len(judged))]
    for worktree, commit in zip(worktrees, judged, strict=True):
        git(repo, "worktree", "add", "-q", "--detach", str(worktree), commit.sha)
    # The validators run beside the plugin's gate, each in the PR's own checkout.
    checks = [validator(worktree, commit) for worktree, commit in zip(worktrees, judged,
                                                                      strict=True)]
    gates = []
    for worktree, commit in zip(worktrees, judged, strict=True):
        monkeypatch.chdir(worktree)
        gates.append(pytester.runpytest(
            "-p", "no:cacheprovider", "-m", "changelog", "--rootdir", str(worktree),
            "--inferbench-changelog-base", commit.parent,
            *(("--inferbench-pr", commit.pr) if commit.pr else ()), str(worktree / CHANGELOG)))
    rows = []
    for commit, check, gate in zip(judged, checks, gates, strict=True):
        _, err = check.communicate(timeout=600)
        failures = [line for line in gate.outlines if line.startswith("FAILED ")]
        rows.append((commit, check.returncode == 0, gate.ret == 0, failures,
                     gate.stdout.str(), err.strip()))
    report = "\n".join(f"{c.entry['config-keys']} {c.entry.get('pr-link')}: validator "
                       f"{'passes' if v else 'fails'}, gate {'passes' if g else 'fails'} "
                       f"{failed} {err[-300:] if not v else ''}"
                       for c, v, g, failed, _, err in rows)
    print(report)
    # The sample's PRs are all ones it accepted (with INFERBENCH_REPLAY_ALL=1 one of the 50 names
    # a config that is retired in this tree, which both then refuse).
    accepted = [row for row in rows if row[1]]
    assert accepted and (len(accepted) == len(rows) or judged is commits), report
    # The gate passes every one of them, the entry whose link ends in `/changes` and the
    # commits after it included: an added entry may link a PR's page, and history is never
    # re-judged.
    assert all(g for _, _, g, _, _, _ in accepted), report
