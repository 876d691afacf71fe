"""Large master files collect without launch specs, and collection has no side effects."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pytest_inferbench.recipe.schema import load_recipe
from pytest_inferbench.testing.recipes import large_master


def test_hundreds_of_entries_collect_without_launch_specs(pytester: pytest.Pytester) -> None:
    (pytester.path / "nvidia-master.yaml").write_text(large_master(300))
    assert not (pytester.path / "launch").exists()
    result = pytester.runpytest("--collect-only", "-q")
    # Per entry: tp4 node (8 + 8 points), tp8-ep8-dpa node (8), tp8-mtp node (5).
    assert result.ret == 0
    assert sum("::" in line for line in result.outlines) == 300 * (16 + 8 + 5)


def test_collect_only_touches_no_network_docker_or_files(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    (pytester.path / "amd-master.yaml").write_text(large_master(4))
    before = sorted(p.name for p in pytester.path.iterdir())

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("collection opened a connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    for backend in ("docker", "sim", "process", "sim-server"):
        result = pytester.runpytest_inprocess(
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:benchmark",
            f"--inferbench-backend={backend}",
        )
        assert result.ret == 0, result.stdout.str()
    assert sorted(p.name for p in pytester.path.iterdir()) == before


def test_load_recipe_is_pure(tmp_path: Path) -> None:
    path = tmp_path / "amd-master.yaml"
    path.write_text(large_master(2))
    first, second = load_recipe(path), load_recipe(path)
    assert first == second  # frozen dataclasses compare by value: same input, same model
