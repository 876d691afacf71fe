"""Agentic-coding points as InferenceX's own matrix generator expands them, row for row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from pytest_inferbench.recipe.schema import load_recipe

from .conftest import REPO

MASTERS = ("nvidia-master.yaml", "amd-master.yaml")


@pytest.fixture(scope="module")
def current_tree() -> Path:
    """InferenceX's current layout (`configs/`, `utils/`): `INFERBENCH_INFERENCEX_CURRENT_DIR`,
    else `../shared/inferencex-0801`."""
    source = Path(os.environ.get("INFERBENCH_INFERENCEX_CURRENT_DIR")
                  or REPO.parent / "shared" / "inferencex-0801")
    if not (source / "utils" / "matrix_logic" / "generate_sweep_configs.py").is_file():
        pytest.skip(f"no current InferenceX tree at {source}")
    return source


def _component(value: object) -> str | None:
    if not isinstance(value, dict):
        return None
    return f"{value['name']}@{value['version']}" if value.get("version") else value["name"]


def _generator_rows(tree: Path) -> list[tuple[object, ...]]:
    argv = [sys.executable, str(tree / "utils" / "matrix_logic" / "generate_sweep_configs.py"),
            "full-sweep", "--config-files", *(f"configs/{name}" for name in MASTERS),
            "--runner-config", "configs/runners.yaml", "--scenario-type", "agentic-coding",
            "--no-evals", "--single-node", "--multi-node"]
    done = subprocess.run(argv, cwd=tree, capture_output=True, text=True, check=False,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    rows = []
    for row in json.loads(done.stdout):
        conc = row["conc"]
        if isinstance(conc, list):  # a multinode row: one concurrency per allocation
            assert len(conc) == 1, row
            conc = conc[0]
        rows.append((row["exp-name"], row["image"], row["model"], row["precision"],
                     row["framework"], row["runner"], row["spec-decoding"], conc,
                     row["kv-offloading"], _component(row.get("kv-offload-backend")),
                     row["total-cpu-dram-gb"], _component(row.get("router")),
                     row.get("kv-p2p-transfer"), "prefill" in row, row.get("tp")))
    return rows


def _plugin_rows(tree: Path) -> list[tuple[object, ...]]:
    rows = []
    for name in MASTERS:
        recipe = load_recipe(tree / "configs" / name)
        for server in recipe.servers:
            if server.scenario != "agentic-coding":
                continue
            for point in server.points():
                row = (point.exp_name, server.image, server.model, server.precision,
                       server.framework, server.runner, server.spec_decoding, point.conc,
                       server.offloading, server.kv_offload_backend, server.total_cpu_dram_gb,
                       server.router, server.kv_p2p_transfer, server.multinode,
                       None if server.multinode else server.parallel.tp)
                # A point two rows of one server give runs once; the generator lists both.
                rows.extend([row] * (1 + len(point.repeated_at)))
    return rows


def test_agentic_points_match_the_generator_row_for_row(current_tree: Path) -> None:
    generated = Counter(_generator_rows(current_tree))
    collected = Counter(_plugin_rows(current_tree))
    assert sum(generated.values()) > 0
    assert collected == generated, (
        f"only in the generator: {list((generated - collected).elements())[:5]}; "
        f"only collected: {list((collected - generated).elements())[:5]}")
