"""The changelog gate of a branch: which entries it added, and the configs its diff touches.

Computed once per changelog file against the base revision (`--inferbench-changelog-base`, or
origin/main with `--inferbench-pr`): the history rule (`history.py`), the indices of the added
entries, and the configs the branch touched (`changes.py`), so that an added entry naming a
config the diff neither adds nor changes fails with that config named.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..options import GIT_TIMEOUT_S
from ..recipe.schema import RecipeError, load_recipe
from . import ChangelogEntry, ChangelogError
from .changes import Revision, RevisionError, touched_configs
from .history import check_history

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True)
class Gate:
    added: frozenset[int]  # 0-based indices of entries the branch appended
    history_failures: tuple[str, ...]
    touched: frozenset[str]  # config keys whose entry, launch spec or script changed


def recipe_files(directories: tuple[Path, ...], globs: tuple[str, ...]) -> list[Path]:
    return sorted({p for d in directories for g in globs for p in d.glob(g)})


def launch_names(recipes: list[Path]) -> dict[str, set[str]]:
    """Config key -> the launch spec and InferenceX server script stems that start it."""
    names: dict[str, set[str]] = {}
    for path in recipes:
        try:
            recipe = load_recipe(path, strict=False)
        except RecipeError:
            continue
        for s in recipe.servers:
            names.setdefault(s.config_key, set()).update({
                s.launch_spec_name, s.config_key.replace("-", "_"),
                f"{s.model_prefix}_{s.precision}_{s.hardware.lower()}"})
    return names


def compute_gate(changelog: Path, base_rev: str, recipes: list[Path],
                 git_timeout_s: float = GIT_TIMEOUT_S) -> Gate:
    """Raises `ChangelogError` when git fails or a file at the base cannot be read."""
    try:
        revision = Revision.of(changelog, base_rev, "--inferbench-changelog-base",
                               git_timeout_s)
        stored = revision.read_yaml(changelog)  # a base that is not YAML: said, not guessed
        base_raw = stored[0] if stored is not None else None
        touched = touched_configs(revision, recipes, launch_names(recipes))
    except RevisionError as exc:
        raise ChangelogError(str(exc)) from None
    history = check_history(base_raw or b"", changelog.read_bytes())
    if base_raw is None:  # the changelog is new on this branch: every entry is added
        history.failures.clear()
    return Gate(frozenset(history.added), tuple(history.failures), frozenset(touched))


def untouched_configs(entry: ChangelogEntry, gate: Gate, known: set[str]) -> list[str]:
    """The configs an added entry names that the branch's diff does not touch."""
    named: set[str] = set()
    for key in entry.config_keys:
        if "*" in key:
            named.update(k for k in known if fnmatch.fnmatchcase(k, key))
        else:
            named.add(key)
    return sorted(k for k in named if k in known and k not in gate.touched)
