"""What a branch changed since a git revision: its files, and the master entries (per scenario)
that are new or differ as data. `--inferbench-changed-since` asks this module which server
nodes those changes start differently (`launchers.py` names the files that start a node).

Git runs only through `run_git`: an argv (never a shell), a deadline, and for every failure
(git missing, a non-zero exit, a hung git) a `GitError` whose message says which command and
why, so that no caller meets a traceback or waits for ever.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ..options import GIT_TIMEOUT_S
from ..util.yamllines import load_data

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..recipe.model import ServerConfig


class RevisionError(Exception):
    """The base revision cannot be compared with the working tree; the message says why."""


class GitError(RevisionError):
    """git cannot answer (missing, not a repository, unknown revision, failed, hung)."""


class BaseFileError(RevisionError):
    """A file as stored at the base revision cannot be read (not UTF-8, not YAML)."""


def run_git(cwd: Path, *args: str, timeout_s: float = GIT_TIMEOUT_S,
            ok_codes: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[bytes]:
    """`git -C cwd ARGS`; an exit status outside `ok_codes` is a `GitError` naming the command
    and git's stderr."""
    argv = ["git", "-C", str(cwd), *args]
    shown = " ".join(argv)
    try:
        # Its own session, so that a timeout kills git's children too (a credential helper,
        # ssh, a pager): a child left holding the pipes would keep us waiting after all.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:  # FileNotFoundError when git is not on PATH
        raise GitError(f"cannot run {shown}: {exc.strerror or exc} (is git installed and on "
                       "PATH?)") from None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise GitError(f"{shown}: no answer within {timeout_s:g} s (git hangs; the "
                       "inferbench_git_timeout ini value sets the limit)") from None
    except BaseException:  # an interrupt: in a session of its own, git would not hear it
        _kill_group(proc)
        raise
    if proc.returncode not in ok_codes:
        detail = err.decode(errors="replace").strip() or "no message"
        raise GitError(f"{shown} failed (exit status {proc.returncode}): {detail}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # it may have ended just now
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


@dataclass(frozen=True)
class Revision:
    """A git revision of the repository that holds `anchor`."""

    top: Path
    rev: str
    timeout_s: float = GIT_TIMEOUT_S

    @classmethod
    def of(cls, anchor: Path, rev: str, option: str,
           timeout_s: float = GIT_TIMEOUT_S) -> Revision:
        directory = anchor if anchor.is_dir() else anchor.parent
        top = run_git(directory, "rev-parse", "--show-toplevel", timeout_s=timeout_s,
                      ok_codes=(0, 128))
        if top.returncode != 0:
            raise GitError(f"{anchor}: not in a git repository "
                           f"({top.stderr.decode(errors='replace').strip()})")
        found = run_git(directory, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}",
                        timeout_s=timeout_s, ok_codes=(0, 1))
        if found.returncode != 0:
            raise GitError(f"{option} {rev!r}: no such git revision")
        return cls(Path(os.fsdecode(top.stdout).strip()), rev, timeout_s)

    def git(self, *args: str, ok_codes: tuple[int, ...] = (0,)
            ) -> subprocess.CompletedProcess[bytes]:
        return run_git(self.top, *args, timeout_s=self.timeout_s, ok_codes=ok_codes)

    def relative(self, path: Path) -> str:
        return path.resolve().relative_to(self.top.resolve()).as_posix()

    def read(self, path: Path) -> bytes | None:
        """The file as stored at the revision; None when it did not exist there."""
        name = self.relative(path)
        # Asked apart from the read, so that "not there" is never guessed from an error text.
        listed = self.git("ls-tree", "-z", "--name-only", self.rev, "--", name)
        if not listed.stdout.strip(b"\0"):
            return None
        return self.git("cat-file", "blob", f"{self.rev}:{name}").stdout

    def changed_files(self) -> set[Path]:
        """Files that differ between the revision and the working tree (committed or not),
        and untracked files."""
        diff = self.git("diff", "--name-only", "-z", self.rev, "--")
        untracked = self.git("ls-files", "--others", "--exclude-standard", "-z")
        names = os.fsdecode(diff.stdout + b"\0" + untracked.stdout).split("\0")
        return {self.top / name for name in names if name}

    def read_yaml(self, path: Path) -> tuple[bytes, object] | None:
        """The file as stored at the revision and its YAML data; None when it did not exist
        there; a file that is not UTF-8 YAML is a `BaseFileError` naming it and the revision."""
        raw = self.read(path)
        if raw is None:
            return None
        try:
            return raw, load_data(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            problem = f"line {line}: not UTF-8 text"
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else 1
            problem = f"line {line}: not readable YAML ({getattr(exc, 'problem', None) or exc})"
        raise BaseFileError(f"{self.relative(path)} at revision {self.rev}: {problem}; "
                            "the branch's changes to it cannot be told")

    def entries(self, path: Path) -> dict[str, object]:
        """The top-level entries of a YAML file as stored at the revision ({} when it did not
        exist there)."""
        stored = self.read_yaml(path)
        return _mapping(stored[1]) if stored is not None else {}


def _mapping(data: object) -> dict[str, object]:
    return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}


ALL_SCENARIOS = "*"  # an entry change outside its `scenarios:` sections touches each of them


@dataclass(frozen=True)
class Changes:
    """What a branch changed since a revision, in the terms a server node is built from."""

    files: frozenset[Path]  # resolved: changed, added, deleted or untracked
    entries: frozenset[tuple[Path, str, str]]  # (resolved recipe, config key, scenario or "*")

    def entry_changed(self, server: ServerConfig) -> bool:
        """Whether the server's own master entry changed (in its recipe file: a key that
        another file, say a deprecated archive, holds as well is another config)."""
        source = server.source.resolve()
        return bool({(source, server.config_key, ALL_SCENARIOS),
                     (source, server.config_key, server.scenario)} & self.entries)

    def changed_keys(self, recipe: Path) -> set[str]:
        source = recipe.resolve()
        return {key for path, key, _ in self.entries if path == source}

    def any_changed(self, paths: Iterable[Path]) -> bool:
        return any(path.resolve() in self.files for path in paths)


def branch_changes(revision: Revision, recipe_files: Iterable[Path]) -> Changes:
    """Raises `RevisionError` when git fails or a recipe at the revision cannot be read."""
    files = frozenset(p.resolve() for p in revision.changed_files())
    entries: set[tuple[Path, str, str]] = set()
    for recipe in recipe_files:
        path = recipe.resolve()
        if path not in files:
            continue
        before = revision.entries(recipe)
        try:
            after = _mapping(load_data(recipe.read_bytes().decode("utf-8")))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            # Its own collection reports the working tree's broken file, naming its line;
            # what it holds now cannot be told, so each entry it had counts as changed.
            entries.update((path, key, ALL_SCENARIOS) for key in before)
            continue
        for key, value in after.items():
            entries.update((path, key, scenario)
                           for scenario in _changed_scenarios(before.get(key), value))
    return Changes(files, frozenset(entries))


def _changed_scenarios(before: object, after: object) -> set[str]:
    """The scenarios of one master entry that differ: those whose `scenarios:` section
    changed, or all of them when anything else in the entry did."""
    if before == after:
        return set()
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return {ALL_SCENARIOS}
    outside = {k: v for k, v in before.items() if k != "scenarios"}
    if outside != {k: v for k, v in after.items() if k != "scenarios"}:
        return {ALL_SCENARIOS}
    old, new = _mapping(before.get("scenarios")), _mapping(after.get("scenarios"))
    return {name for name in old.keys() | new.keys() if old.get(name) != new.get(name)}
