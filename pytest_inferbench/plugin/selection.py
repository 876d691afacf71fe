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

from ..changelog import ChangelogError, load_changelog
from ..changelog.changes import GitError, Revision, touched_configs
from ..changelog.gate import launch_names
from ..changelog.history import check_history
from ..changelog.items import ChangelogFile, ChangelogItem, HistoryItem
from ..evals.collect import EvalItem
from .collect import BenchItem, InvalidEntryItem


def changed_since(config: pytest.Config, items: list[pytest.Item], rev: str) -> None:
    recipes = sorted({Path(i.server_node.server.source) for i in items
                      if isinstance(i, BenchItem | EvalItem)}
                     | {i.path for i in items if isinstance(i, InvalidEntryItem)})
    changelogs = sorted({i.parent.path for i in items
                         if isinstance(i, ChangelogItem | HistoryItem)
                         and isinstance(i.parent, ChangelogFile)})
    try:
        revision = Revision.of(config.rootpath, rev, "--inferbench-changed-since")
    except GitError as exc:
        raise pytest.UsageError(str(exc)) from None
    names = launch_names(recipes)
    touched = touched_configs(revision, recipes, names)
    added: dict[Path, set[int]] = {}
    named: set[str] = set()
    for path in changelogs:
        try:
            entries = load_changelog(path).entries
        except ChangelogError:
            continue
        indices = check_history(revision.read(path) or b"", path.read_bytes()).added
        added[path] = indices
        for entry in entries:
            if entry.index in indices:
                named.update(k for pattern in entry.config_keys for k in names
                             if fnmatch.fnmatchcase(k, pattern))
    wanted = touched | named

    def keep(item: pytest.Item) -> bool:
        if isinstance(item, BenchItem | EvalItem):
            return item.server_node.server.config_key in wanted
        if isinstance(item, InvalidEntryItem):
            return item.entry.config_key in touched
        if isinstance(item, HistoryItem):
            return True
        if isinstance(item, ChangelogItem) and isinstance(item.parent, ChangelogFile):
            return item.entry is not None and item.entry.index in added.get(item.parent.path,
                                                                            set())
        return True  # not the plugin's item

    selected = [i for i in items if keep(i)]
    deselected = [i for i in items if not keep(i)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected



