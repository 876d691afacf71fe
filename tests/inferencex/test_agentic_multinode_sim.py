"""InferenceX's multinode agentic-coding entries (the current tree) on the default `sim`
backend: none is refused, and a sample of them -- aggregated with a CPU-DRAM tier, a
disaggregated deployment of six decode workers, AMD's SGLang disaggregation with its random
router -- replays in process with a short duration."""

from __future__ import annotations

import json
import shutil
from typing import TYPE_CHECKING

from pytest_inferbench.options.backend_registry import unsupported_reason
from pytest_inferbench.recipe.agentic import SCENARIO
from pytest_inferbench.recipe.schema import load_recipe

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

SAMPLE = (
    "configs/nvidia-master.yaml::qwen3.5-fp4-gb300-dynamo-sglang-agentic-agg-p1x4-d0x4-"
    "s54051134-offload-dram-hicache-mtp::agentic-conc1",
    "configs/nvidia-master.yaml::dsv4-fp4-gb300-dynamo-vllm-agentic-p1x4ep4dpa-d6x4-s3f3a3363"
    "::agentic-conc32",
    "configs/amd-master.yaml::dsv4-fp4-mi355x-sglang-disagg-agentic-hicache-p1x8-d1x8-s93abf338"
    "-offload-dram-hicache::agentic-conc2",
)


def _configs(source: Path, target: Path) -> Path:
    """The tree's recipes and runners.yaml (what collection and the DRAM budgets read)."""
    configs = target / "configs"
    configs.mkdir()
    for name in ("nvidia-master.yaml", "amd-master.yaml", "runners.yaml"):
        shutil.copyfile(source / "configs" / name, configs / name)
    return configs


def test_no_multinode_agentic_entry_is_refused_by_the_sim_backend(
        inferencex_current_dir: Path) -> None:
    servers = [s for name in ("nvidia-master.yaml", "amd-master.yaml")
               for s in load_recipe(inferencex_current_dir / "configs" / name).servers
               if s.scenario == SCENARIO and s.multinode]
    # Aggregated (no decode workers) and disaggregated deployments.
    assert {s.decode is not None and s.decode.num_worker > 0 for s in servers} == {True, False}
    refused = {s.node_name: unsupported_reason("sim", multinode=True, agentic=True,
                                               offloading=s.offloading) for s in servers}
    assert not {name: why for name, why in refused.items() if why is not None}


def test_a_sample_of_them_replays_in_process(inferencex_current_dir: Path,
                                             pytester: pytest.Pytester) -> None:
    _configs(inferencex_current_dir, pytester.path)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "--inferbench-no-plots",
                                "--inferbench-replay-duration=30", *SAMPLE)
    result.assert_outcomes(passed=len(SAMPLE))
    deployments = set()
    for path in (pytester.path / "inferbench-results" / "points").glob("*.json"):
        if path.name.startswith("agg_"):
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        record = {**data, **data["inferbench"]}
        assert record["is_multinode"] and record["backend"] == "sim"
        assert record["completed"] > 0 and record["agentic"]["request_metrics"]
        metrics = record["server_metrics"]
        deployments.add(metrics["deployment"])
        assert metrics["prefix_cache_hits"] > 0
        if record["kv_offloading"] == "dram":
            assert metrics["kv_tiers"]["host_tokens_total"] > 0
    assert deployments == {"agg1x4", "p1x4ep4dpa-d6x4", "p1x8-d1x8"}
