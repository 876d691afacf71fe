"""What a branch changed since a git revision: the configs it touches.

A config is touched when its master-file entry is new or differs (as data) from the revision,
when its launch spec changed, or when its InferenceX server script
(`<prefix>_<precision>_<gpu>[_<framework>][_mtp].sh`) changed. The changelog gate and
`--inferbench-changed-since` both ask this module; git runs as an argv, never through a shell.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..util.yamllines import load_data


class GitError(Exception):
    """git cannot answer (not a repository, unknown revision); the message says why."""


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, check=False,
                          timeout=60)


@dataclass(frozen=True)
class Revision:
    """A git revision of the repository that holds `anchor`."""

    top: Path
    rev: str

    @classmethod
    def of(cls, anchor: Path, rev: str, option: str) -> Revision:
        directory = anchor if anchor.is_dir() else anchor.parent
        top = git(directory, "rev-parse", "--show-toplevel")
        if top.returncode != 0:
            raise GitError(f"{anchor}: not in a git repository "
                           f"({top.stderr.decode(errors='replace').strip()})")
        found = git(directory, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
        if found.returncode != 0:
            raise GitError(f"{option} {rev!r}: no such git revision")
        return cls(Path(top.stdout.decode().strip()), rev)

    def relative(self, path: Path) -> str:
        return path.resolve().relative_to(self.top.resolve()).as_posix()

    def read(self, path: Path) -> bytes | None:
        """The file as stored at the revision; None when it did not exist there."""
        shown = git(self.top, "show", f"{self.rev}:{self.relative(path)}")
        return shown.stdout if shown.returncode == 0 else None

    def changed_files(self) -> set[Path]:
        """Files that differ between the revision and the working tree (committed or not),
        and untracked files."""
        diff = git(self.top, "diff", "--name-only", "-z", self.rev, "--")
        untracked = git(self.top, "ls-files", "--others", "--exclude-standard", "-z")
        names = (diff.stdout + b"\0" + untracked.stdout).decode().split("\0")
        return {self.top / name for name in names if name}


def _entries(text: bytes | str | None) -> dict[str, object]:
    if not text:
        return {}
    data = load_data(text)
    return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}


def touched_configs(revision: Revision, recipe_files: list[Path],
                    launch_names: dict[str, set[str]]) -> set[str]:
    """Config keys touched since the revision.

    launch_names: config key -> the launch spec / script stems that start its server.
    """
    touched: set[str] = set()
    changed = revision.changed_files()
    for recipe in recipe_files:
        if recipe.resolve() not in {p.resolve() for p in changed}:
            continue
        before = _entries(revision.read(recipe))
        after = _entries(recipe.read_bytes())
        touched.update(key for key, value in after.items() if before.get(key) != value)
    stems = {p.stem for p in changed if p.suffix in (".yaml", ".sh")}
    stems |= {stem.removesuffix("_mtp") for stem in stems}
    touched.update(key for key, names in launch_names.items() if names & stems)
    return touched
