"""The changelog becomes one item per entry (marker `changelog`), plus a `history` item.

File-level problems (trailing newline, tabs, ...) fail the first entry's item. With a base
revision (`--inferbench-changelog-base REV`, or origin/main with `--inferbench-pr N`) the
`history` item checks that existing entries are untouched and additions are appended, each
added entry must name live configs and link PR N (or XXX), and the entries the branch did not
add pass (never re-judged). Without a base each entry is held to the schema alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from . import (
    Changelog,
    ChangelogEntry,
    ChangelogError,
    check_entry,
    known_config_keys,
    load_changelog,
)
from .gate import Gate, compute_gate

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from _pytest._code.code import TracebackStyle

    from ..options import Settings

CHANGELOG_MARKER = "changelog: a perf-changelog.yaml entry check"
DEFAULT_BASE = "origin/main"


def base_revision(settings: Settings) -> str | None:
    if settings.changelog_base is not None:
        return settings.changelog_base
    return DEFAULT_BASE if settings.pr_number is not None else None


class ChangelogFile(pytest.File):
    """The entries of one changelog; git and the master configs are read once per file."""

    _gate: Gate | ChangelogError | None = None
    _keys_cache: set[str] | None = None

    @property
    def settings(self) -> Settings:
        from ..state import get_session_state

        return get_session_state(self.config).settings

    def gate(self, base_rev: str) -> Gate:
        if self._gate is None:
            try:
                self._gate = compute_gate(self.path, base_rev, self.settings.git_timeout_s)
            except ChangelogError as exc:
                self._gate = exc
        if isinstance(self._gate, ChangelogError):
            raise self._gate
        return self._gate

    def known_keys(self) -> set[str]:
        if self._keys_cache is None:
            layout = self.settings.layout
            self._keys_cache = set().union(*(
                known_config_keys(directory, self.settings.recipe_globs)
                for directory in layout.changelog_recipe_dirs(self.path)))
        return self._keys_cache

    def collect(self) -> Iterable[pytest.Item]:
        try:
            changelog = load_changelog(self.path)
        except ChangelogError as exc:
            raise self.CollectError(str(exc)) from None
        if base_revision(self.settings) is not None:
            yield HistoryItem.from_parent(self, name="history")
        if not changelog.entries:
            yield ChangelogItem.from_parent(self, name="file", changelog=changelog, entry=None)
        for entry in changelog.entries:
            yield ChangelogItem.from_parent(self, name=f"entry{entry.index + 1}",
                                            changelog=changelog, entry=entry)


class _ChangelogCheck(pytest.Item):
    """A changelog check: marked `changelog`, failing with its problem lines only."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_marker(pytest.mark.changelog)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: TracebackStyle | None = None) -> str:
        if isinstance(excinfo.value, ChangelogCheckFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))


class ChangelogItem(_ChangelogCheck):
    def __init__(self, *, changelog: Changelog, entry: ChangelogEntry | None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.changelog = changelog
        self.entry = entry
        # -k "minimaxm3 and mi355x" selects the entries that name those configs too.
        if entry is not None:
            self.extra_keyword_matches.update(entry.config_keys)

    def runtest(self) -> None:
        settings = self._file.settings
        failures: list[str] = []
        if self.entry is None or self.entry.index == 0:
            failures += self.changelog.problems
        if self.entry is not None:
            failures += self._entry_failures(settings)
        if failures:
            raise ChangelogCheckFailed("\n".join(failures))

    def is_added(self) -> bool:
        """Whether the branch added this entry (needs a base revision)."""
        base = base_revision(self._file.settings)
        return (base is not None and self.entry is not None
                and self.entry.index in self._file.gate(base).added)

    def _entry_failures(self, settings: Settings) -> list[str]:
        assert self.entry is not None
        base = base_revision(settings)
        try:
            added = self.is_added()
        except ChangelogError as exc:
            return [str(exc)]
        if base is not None and not added:
            return []  # an entry the branch did not add: the history item guards it
        known = self._file.known_keys()
        return check_entry(self.entry, known, settings.pr_number, added)

    @property
    def _file(self) -> ChangelogFile:
        assert isinstance(self.parent, ChangelogFile)
        return self.parent

    def reportinfo(self) -> tuple[Path, int, str]:
        line = self.entry.line if self.entry else 1
        return self.path, line - 1, f"{self.name} (line {line})"


class HistoryItem(_ChangelogCheck):
    """Existing entries unchanged byte for byte, additions appended after one empty line."""

    def runtest(self) -> None:
        assert isinstance(self.parent, ChangelogFile)
        base = base_revision(self.parent.settings)
        assert base is not None
        try:
            failures = list(self.parent.gate(base).history_failures)
        except ChangelogError as exc:
            failures = [str(exc)]
        if failures:
            raise ChangelogCheckFailed("\n".join(failures))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, "history"


class ChangelogCheckFailed(Exception):
    """One line per problem of a changelog entry."""
