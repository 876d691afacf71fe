"""Helpers for writing InferenceX master configs into a pytester directory."""

from __future__ import annotations

import textwrap

# Imported before any in-process pytester run: pytester forgets the modules a run imported
# first, and numpy's C extension cannot be imported a second time in one process.
import numpy  # noqa: F401
import pytest

from pytest_inferbench.testing.recipes import master_entry


def entry(key: str, rows: list[str], runner: str = "mi355x", framework: str = "atom") -> str:
    return master_entry(key, rows, runner=runner, framework=framework)


@pytest.fixture(name="master_entry")
def master_entry_fixture():  # type: ignore[no-untyped-def]
    return entry


@pytest.fixture
def write_master(pytester: pytest.Pytester):  # type: ignore[no-untyped-def]
    def write(text: str, name: str = "amd-master.yaml") -> None:
        (pytester.path / name).write_text(textwrap.dedent(text), encoding="utf-8")

    return write
