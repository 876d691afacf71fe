"""`perf-changelog.yaml` beside the recipes becomes one item per entry (marker `changelog`).

File-level problems (trailing newline, tabs, ...) fail the first entry's item; with
`--inferbench-pr N`, entries added since `--inferbench-changelog-base` must link PR N.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any

import pytest

from . import (
    Changelog,
    ChangelogEntry,
    ChangelogError,
    added_indices,
    check_entry,
    known_config_keys,
    load_changelog,
)

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

CHANGELOG_NAME = "perf-changelog.yaml"
CHANGELOG_MARKER = "changelog: a perf-changelog.yaml entry check"


def is_changelog(file_path: Path, recipe_globs: tuple[str, ...]) -> bool:
    """A perf-changelog.yaml with master configs beside it."""
    if file_path.name != CHANGELOG_NAME:
        return False
    return any(fnmatch.fnmatch(p.name, g) for p in file_path.parent.iterdir() for g in recipe_globs)


class ChangelogFile(pytest.File):
    """The entries of one changelog; git and the master configs are read once per file."""

    _added_cache: dict[str, set[int]] | None = None
    _keys_cache: set[str] | None = None

    def added(self, base_rev: str) -> set[int]:
        if self._added_cache is None:
            self._added_cache = {}
        if base_rev not in self._added_cache:
            self._added_cache[base_rev] = added_indices(self.path, base_rev)
        return self._added_cache[base_rev]

    def known_keys(self, globs: tuple[str, ...]) -> set[str]:
        if self._keys_cache is None:
            self._keys_cache = known_config_keys(self.path.parent, globs)
        return self._keys_cache

    def collect(self) -> Iterable[pytest.Item]:
        from ..state import get_session_state

        settings = get_session_state(self.config).settings
        try:
            changelog = load_changelog(self.path)
        except ChangelogError as exc:
            raise self.CollectError(str(exc)) from None
        if not changelog.entries:
            yield ChangelogItem.from_parent(
                self, name="file", changelog=changelog, entry=None, globs=settings.recipe_globs
            )
        for entry in changelog.entries:
            yield ChangelogItem.from_parent(
                self,
                name=f"entry{entry.index + 1}",
                changelog=changelog,
                entry=entry,
                globs=settings.recipe_globs,
            )


class ChangelogItem(pytest.Item):
    def __init__(
        self,
        *,
        changelog: Changelog,
        entry: ChangelogEntry | None,
        globs: tuple[str, ...],
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.changelog = changelog
        self.entry = entry
        self.globs = globs
        self.add_marker(pytest.mark.changelog)

    def runtest(self) -> None:
        from ..state import get_session_state

        settings = get_session_state(self.config).settings
        failures: list[str] = []
        if self.entry is None or self.entry.index == 0:
            failures += self.changelog.problems
        if self.entry is not None:
            added = False
            if settings.pr_number is not None:
                try:
                    added = self.entry.index in self._file.added(settings.changelog_base)
                except ChangelogError as exc:
                    failures.append(str(exc))
            known = self._file.known_keys(self.globs)
            failures += check_entry(self.entry, known, settings.pr_number, added)
        if failures:
            raise ChangelogCheckFailed("\n".join(failures))

    @property
    def _file(self) -> ChangelogFile:
        assert isinstance(self.parent, ChangelogFile)
        return self.parent

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ChangelogCheckFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Any, int, str]:
        line = self.entry.line if self.entry else 1
        return self.path, line - 1, f"{self.name} (line {line})"


class ChangelogCheckFailed(Exception):
    """One line per problem of a changelog entry."""
