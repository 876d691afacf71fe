"""The changelog gate of a branch: which entries it added, and whether its history holds.

Computed once per changelog file against the base revision (`--inferbench-changelog-base`, or
origin/main with `--inferbench-pr`): the history rule (`history.py`) and the indices of the
added entries, which alone are judged (entries the branch did not add are never re-judged).
An added entry may name configs the diff leaves alone: InferenceX accepts a changelog-only
change that reruns a config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..options import GIT_TIMEOUT_S
from . import ChangelogError
from .changes import Revision, RevisionError
from .history import check_history

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True)
class Gate:
    added: frozenset[int]  # 0-based indices of entries the branch appended
    history_failures: tuple[str, ...]


def compute_gate(changelog: Path, base_rev: str, git_timeout_s: float = GIT_TIMEOUT_S) -> Gate:
    """Raises `ChangelogError` when git fails or the changelog at the base cannot be read."""
    try:
        revision = Revision.of(changelog, base_rev, "--inferbench-changelog-base",
                               git_timeout_s)
        stored = revision.read_yaml(changelog)  # a base that is not YAML: said, not guessed
    except RevisionError as exc:
        raise ChangelogError(str(exc)) from None
    base_raw = stored[0] if stored is not None else None
    history = check_history(base_raw or b"", changelog.read_bytes())
    if base_raw is None:  # the changelog is new on this branch: every entry is added
        history.failures.clear()
    return Gate(frozenset(history.added), tuple(history.failures))
