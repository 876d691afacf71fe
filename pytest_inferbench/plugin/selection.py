"""`--inferbench-changed-since REV`: run only what a branch changed, as InferenceX's PR sweep does.

Kept: the server nodes of configs whose recipe entry, launch spec or server script changed since
REV, and of configs named by changelog entries added since REV; the invalid entries among the
changed ones; the changelog's added entries and its history check. Everything else that the
plugin collected is deselected; `-k`/`-m` still apply on top.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from ..changelog import ChangelogEntry, ChangelogError, load_changelog
from ..changelog.changes import Revision, RevisionError, touched_configs
from ..changelog.gate import launch_names
from ..changelog.history import check_history
from ..changelog.items import ChangelogFile, ChangelogItem, HistoryItem
from ..evals.collect import EvalItem
from ..state import get_session_state
from .collect import BenchItem, InvalidEntryItem


def changed_since(config: pytest.Config, items: list[pytest.Item], rev: str) -> None:
    recipes = sorted({Path(i.server_node.server.source) for i in items
                      if isinstance(i, BenchItem | EvalItem)}
                     | {i.path for i in items if isinstance(i, InvalidEntryItem)})
    changelogs = sorted({i.parent.path for i in items
                         if isinstance(i, ChangelogItem | HistoryItem)
                         and isinstance(i.parent, ChangelogFile)})
    names = launch_names(recipes)
    try:
        revision = Revision.of(config.rootpath, rev, "--inferbench-changed-since",
                               get_session_state(config).settings.git_timeout_s)
        touched = touched_configs(revision, recipes, names)
        added = {path: _added_entries(revision, path) for path in changelogs}
    except RevisionError as exc:
        raise pytest.UsageError(f"--inferbench-changed-since {rev}: {exc}") from None
    named: set[str] = set()
    for entries in added.values():
        named.update(k for entry in entries for pattern in entry.config_keys for k in names
                     if fnmatch.fnmatchcase(k, pattern))
    indices = {path: {entry.index for entry in entries} for path, entries in added.items()}
    wanted = touched | named

    def keep(item: pytest.Item) -> bool:
        if isinstance(item, BenchItem | EvalItem):
            return item.server_node.server.config_key in wanted
        if isinstance(item, InvalidEntryItem):
            return item.entry.config_key in touched
        if isinstance(item, HistoryItem):
            return True
        if isinstance(item, ChangelogItem) and isinstance(item.parent, ChangelogFile):
            return item.entry is not None and item.entry.index in indices.get(
                item.parent.path, set())
        return True  # not the plugin's item

    selected = [i for i in items if keep(i)]
    deselected = [i for i in items if not keep(i)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


def _added_entries(revision: Revision, path: Path) -> list[ChangelogEntry]:
    """The entries of a changelog that the branch appended since the revision (all of them
    when the file is new); none when the changelog cannot be read (its items say why)."""
    try:
        entries = load_changelog(path).entries
    except ChangelogError:
        return []
    stored = revision.read_yaml(path)
    indices = check_history(stored[0] if stored else b"", path.read_bytes()).added
    return [entry for entry in entries if entry.index in indices]
