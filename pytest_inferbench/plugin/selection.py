"""`--inferbench-changed-since REV`: run only what a branch changed, as InferenceX's PR sweep does.

Kept, point by point: the points of a server node whose own master entry changed since REV
(only the scenario whose `scenarios:` section changed, when nothing else did), whose launch
spec or InferenceX benchmark script changed (that script's scenario only: an agentic script
starts no fixed-seq-len point), or that a changelog entry added since REV names (within its
`scenario-type`); the invalid entries among the changed ones; the changelog's added entries
and its history check. Configs of a `deprecated/` directory are kept only when the command
line names that directory or file. Everything else the plugin collected is deselected;
`-k`/`-m` still apply on top.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..changelog import ChangelogEntry, ChangelogError, key_matches, load_changelog
from ..changelog.changes import Revision, RevisionError, branch_changes
from ..changelog.history import check_history
from ..changelog.items import ChangelogFile, ChangelogItem, HistoryItem
from ..changelog.launchers import launch_files
from ..evals.collect import EvalItem
from ..recipe.model import ServerConfig
from ..state import NOTHING_CHANGED_KEY, get_session_state
from .collect import BenchItem, InvalidEntryItem

DEPRECATED_DIR = "deprecated"


def changed_since(config: pytest.Config, items: list[pytest.Item], rev: str) -> None:
    recipes = sorted({Path(i.server_node.server.source) for i in items
                      if isinstance(i, BenchItem | EvalItem)}
                     | {i.path for i in items if isinstance(i, InvalidEntryItem)})
    changelogs = sorted({i.parent.path for i in items
                         if isinstance(i, ChangelogItem | HistoryItem)
                         and isinstance(i.parent, ChangelogFile)})
    settings = get_session_state(config).settings
    try:
        revision = Revision.of(config.rootpath, rev, "--inferbench-changed-since",
                               settings.git_timeout_s)
        changes = branch_changes(revision, recipes)
        added = {path: _added_entries(revision, path) for path in changelogs}
    except RevisionError as exc:
        raise pytest.UsageError(f"--inferbench-changed-since {rev}: {exc}") from None
    entries = [entry for found in added.values() for entry in found]
    indices = {path: {entry.index for entry in found} for path, found in added.items()}
    asked = _asked_deprecated(config)
    verdicts: dict[ServerConfig, bool] = {}

    def server_changed(server: ServerConfig) -> bool:
        if server not in verdicts:
            verdicts[server] = not _is_deprecated(server.source, config.rootpath, asked) and (
                changes.entry_changed(server)
                or changes.any_changed(launch_files(server, settings.layout, revision.top))
                or any(_names(entry, server) for entry in entries))
        return verdicts[server]

    def keep(item: pytest.Item) -> bool:
        if isinstance(item, BenchItem | EvalItem):
            return server_changed(item.server_node.server)
        if isinstance(item, InvalidEntryItem):
            return item.entry.config_key in changes.changed_keys(item.path)
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
    if deselected and not selected:
        config.stash[NOTHING_CHANGED_KEY] = rev


def nothing_changed(session: pytest.Session) -> str | None:
    """At the session's end: a line saying that nothing changed since the revision, when that
    is why no test ran, and the session's exit status made a success. A PR that touches no
    benchmark has nothing to run; pytest's "no tests collected" (5) would fail its CI step."""
    rev = session.config.stash.get(NOTHING_CHANGED_KEY, None)
    if rev is None or session.exitstatus != pytest.ExitCode.NO_TESTS_COLLECTED:
        return None
    session.exitstatus = pytest.ExitCode.OK
    return (f"nothing changed since {rev} (master entries, launch specs, benchmark scripts, "
            "changelog): no points to run")


def _names(entry: ChangelogEntry, server: ServerConfig) -> bool:
    """Whether an added changelog entry reruns the server's points (InferenceX resolves its
    keys against the live master configs: `*` matches any run of characters)."""
    if entry.scenario_types and server.scenario not in entry.scenario_types:
        return False
    return any(key_matches(pattern, server.config_key) for pattern in entry.config_keys)


def _asked_deprecated(config: pytest.Config) -> list[Path]:
    """The command-line paths inside a `deprecated/` directory: what they hold was asked for."""
    paths = [Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
             for arg in config.args]
    return [p for p in paths if DEPRECATED_DIR in p.parts]


def _is_deprecated(recipe: Path, root: Path, asked: list[Path]) -> bool:
    """A recipe archived in a `deprecated/` directory that the command line did not name."""
    path = recipe.resolve()
    try:
        parts = path.relative_to(root.resolve()).parts
    except ValueError:
        parts = path.parts
    if DEPRECATED_DIR not in parts[:-1]:
        return False
    return not any(path == p or p in path.parents for p in asked)


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
