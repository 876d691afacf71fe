"""A GSM8K-format data set and a node served by the simulator's eval oracle, for runner tests."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_inferbench.backends.base import StartContext
from pytest_inferbench.evals.item import start_oracle_server
from pytest_inferbench.options import Settings
from pytest_inferbench.recipe.launch import ServerSpec, resolve
from pytest_inferbench.recipe.model import ServerConfig
from pytest_inferbench.recipe.schema import load_recipe
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]
RECIPE = master_entry(rows=["{ tp: 4, conc-start: 1, conc-end: 8 }"], isl=256, osl=16)


@dataclasses.dataclass(frozen=True)
class OracleNode:
    server: ServerConfig
    spec: ServerSpec
    settings: Settings
    base_url: str


def write_questions(path: Path, count: int) -> Path:
    """`count` two-number addition questions with gold answers in GSM8K's `#### N` form."""
    rows = ({"question": f"A box holds {i} pens and {i + 7} pencils. How many in all?",
             "answer": f"{i} + {i + 7} = {2 * i + 7}\n#### {2 * i + 7}"} for i in range(count))
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def oracle_node(tmp_path: Path, pytestconfig: pytest.Config,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[OracleNode]:
    """A MiniMax-M3 node whose simulated server answers 45 questions with accuracy 0.7."""
    (tmp_path / "bench-master.yaml").write_text(RECIPE)
    (tmp_path / "launch").mkdir()
    shutil.copy(REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml", tmp_path / "launch")
    data = write_questions(tmp_path / "test.jsonl", 45)
    server = load_recipe(tmp_path / "bench-master.yaml").servers[0]
    spec = resolve(server, tmp_path / "launch")
    settings = dataclasses.replace(Settings.from_config(pytestconfig), eval_data=data,
                                   results_dir=tmp_path / "results", eval_limit=None)
    ctx = StartContext(results_dir=tmp_path / "results", run_id="evaltest", worker_id="master",
                       options=settings)
    monkeypatch.setenv("INFERBENCH_SIM_EVAL_ACCURACY", "0.7")
    handle: Any = start_oracle_server(server, spec, settings, ctx)
    try:
        assert handle.base_url
        yield OracleNode(server, spec, settings, handle.base_url)
    finally:
        handle.stop()
