"""Helpers for writing InferenceX master configs into a pytester directory."""

from __future__ import annotations

import textwrap

import pytest

ENTRY = """\
{key}:
  image: rocm/atom-dev:MiniMax-M3-20260623
  model: amd/MiniMax-M3-MXFP4
  model-prefix: minimaxm3
  runner: {runner}
  precision: fp4
  framework: {framework}
  multinode: false
  scenarios:
    fixed-seq-len:
      - isl: 1024
        osl: 1024
        search-space:
{rows}
"""


def entry(key: str, rows: list[str], runner: str = "mi355x", framework: str = "atom") -> str:
    body = "\n".join(f"          - {row}" for row in rows)
    return ENTRY.format(key=key, rows=body, runner=runner, framework=framework)


@pytest.fixture
def master_entry():  # type: ignore[no-untyped-def]
    return entry


@pytest.fixture
def write_master(pytester: pytest.Pytester):  # type: ignore[no-untyped-def]
    def write(text: str, name: str = "amd-master.yaml") -> None:
        (pytester.path / name).write_text(textwrap.dedent(text), encoding="utf-8")

    return write
