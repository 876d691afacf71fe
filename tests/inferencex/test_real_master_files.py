"""InferenceX's own master files collect in full, point for point as InferenceX expands them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_inferbench.recipe.schema import load_recipe

MASTERS = (".github/configs/amd-master.yaml", ".github/configs/nvidia-master.yaml")


def generator_single_node_points(checkout: Path) -> int:
    """Points InferenceX's own generator (utils/matrix_logic) expands the single-node
    fixed-seq-len entries of both master files into."""
    out = subprocess.run(
        [sys.executable, "utils/matrix_logic/generate_sweep_configs.py", "full-sweep",
         "--config-files", *MASTERS, "--single-node", "--scenario-type", "fixed-seq-len",
         "--no-evals"],
        cwd=checkout, capture_output=True, text=True, check=True, timeout=300)
    matrix = json.loads(out.stdout)
    assert all(isinstance(entry["conc"], int) for entry in matrix)  # one point per entry
    return len(matrix)


def test_every_entry_collects_and_single_node_points_match_the_generator(
    inferencex_dir: Path, pytester: pytest.Pytester
) -> None:
    recipes = [load_recipe(inferencex_dir / name, strict=False) for name in MASTERS]
    assert [r.invalid_entries for r in recipes] == [(), ()]
    servers = [s for r in recipes for s in r.servers]
    single = sum(len(s.points()) for s in servers
                 if not s.multinode and s.scenario == "fixed-seq-len")
    assert single == generator_single_node_points(inferencex_dir)
    # Every config key of both files is a server node's config key.
    import yaml

    keys = {k for name in MASTERS
            for k in yaml.safe_load((inferencex_dir / name).read_text(encoding="utf-8"))}
    assert {s.config_key for s in servers} == keys
    assert len({s.node_name for s in servers}) == len(servers)

    for name in MASTERS:
        target = pytester.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((inferencex_dir / name).read_bytes())
    result = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider",
                                          ".github/configs")
    assert result.ret == 0, result.stdout.str()[-2000:]
    ids = [line for line in result.outlines if "::" in line]
    assert len(ids) == sum(len(s.points()) for s in servers)
    assert f"{len(ids)} tests collected" in result.stdout.str()
    assert "error" not in result.outlines[-1]


def test_multinode_entries_skip_off_the_simulator(
    inferencex_dir: Path, pytester: pytest.Pytester
) -> None:
    name = MASTERS[1]
    target = pytester.path / name
    target.parent.mkdir(parents=True)
    target.write_bytes((inferencex_dir / name).read_bytes())
    # A disaggregated multinode entry on a backend that does not run it (the sim backend runs
    # multinode entries: test_multinode_sample.py; agentic ones run on the process backend).
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-rs", ".github/configs", "--inferbench-backend", "process",
        "-k", "minimaxm3-fp8-b300-dynamo-vllm")
    outcomes = result.parseoutcomes()
    assert outcomes["skipped"] > 0
    assert set(outcomes) == {"skipped", "deselected"}, outcomes
    result.stdout.fnmatch_lines(
        ["SKIPPED * multinode: not supported by the process backend yet*"])
