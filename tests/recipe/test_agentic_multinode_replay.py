"""Multinode agentic-coding points on the default `sim` backend: each replays its traces in
process on its deployment (`sim/cluster_replay.py`), aggregated or disaggregated, and reports
the keys and files a single-node agentic point does, with its deployment's own numbers (each
instance's prefix-cache hits, the KV transfers, a dram point's CPU-DRAM tier)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from test_agentic_entries import RUNNERS

from pytest_inferbench.results.power import AGG_KEYS

if TYPE_CHECKING:
    import pytest

RECIPE = """\
qwen3.5-fp8-b200-sglang-agentic:
  image: lmsysorg/sglang:v0.5.16-cu130
  model: Qwen/Qwen3.5-397B-A17B-FP8
  model-prefix: qwen3.5
  runner: cluster:b200-dgxc
  precision: fp8
  framework: sglang
  multinode: false
  scenarios:
    agentic-coding:
    - dram-utilization: 0.80
      search-space:
      - { tp: 4, kv-offloading: none, conc-list: [4] }
qwen3.5-fp4-gb300-dynamo-sglang-agentic-agg:
  image: lmsysorg/sglang:nightly
  model: nvidia/Qwen3.5-397B-A17B-NVFP4
  model-prefix: qwen3.5
  runner: cluster:gb300-nv
  precision: fp4
  framework: dynamo-sglang
  multinode: true
  disagg: false
  scenarios:
    agentic-coding:
    - dram-utilization: 0.80
      search-space:
      - conc-list: [4]
        kv-offloading: none
        prefill: { num-worker: 2, tp: 4, ep: 1, dp-attn: false }
        decode: { num-worker: 0, tp: 4, ep: 1, dp-attn: false }
qwen3.5-fp4-gb300-dynamo-sglang-agentic-disagg:
  image: lmsysorg/sglang:nightly
  model: nvidia/Qwen3.5-397B-A17B-NVFP4
  model-prefix: qwen3.5
  runner: cluster:gb300-nv
  precision: fp4
  framework: dynamo-sglang
  router: { name: dynamo-router, version: "1" }
  kv-p2p-transfer: nixl
  multinode: true
  disagg: true
  scenarios:
    agentic-coding:
    - dram-utilization: 0.80
      search-space:
      - conc-list: [4]
        kv-offloading: dram
        kv-offload-backend: { name: hicache }
        prefill: { num-worker: 2, tp: 4, ep: 1, dp-attn: false }
        decode: { num-worker: 1, tp: 4, ep: 1, dp-attn: false }
"""


def _points(pytester: pytest.Pytester) -> dict[str, dict[str, Any]]:
    """Each point's raw file (the record under `inferbench`), by its server's topology."""
    out = {}
    for path in (pytester.path / "inferbench-results" / "points").glob("*.json"):
        if path.name.startswith("agg_"):
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        record = {**data, **data["inferbench"]}
        kind = record["server_metrics"].get("deployment", "single")
        out[kind[:3]] = record
    return out


def test_multinode_agentic_points_replay_on_their_deployments(
    pytester: pytest.Pytester,
) -> None:
    (pytester.path / "nvidia-master.yaml").write_text(RECIPE, encoding="utf-8")
    (pytester.path / "runners.yaml").write_text(RUNNERS, encoding="utf-8")
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "--inferbench-no-plots",
                                "--inferbench-replay-duration=60")
    result.assert_outcomes(passed=3)
    points = _points(pytester)
    assert sorted(points) == ["agg", "p2x", "sin"]
    single, agg, disagg = points["sin"], points["agg"], points["p2x"]
    # The same replay and the same keys as a single-node point: records, AgentX aggregate.
    for point in (agg, disagg):
        assert point["backend"] == "sim" and point["simulated"] is True
        assert point["workload"]["kind"] == "agentic-replay"
        assert point["workload"]["traces"] == single["workload"]["traces"]
        # A single node's replay carries its power figures; a deployment says why it has none.
        assert single["power_valid"] == 1
        assert point["power_valid"] == 0 and "multinode" in point["power_invalid_reason"]
        def without_power(keys: dict[str, Any]) -> set[str]:
            return {k for k in keys if k not in AGG_KEYS and not k.startswith("power_")}

        assert without_power(point) == without_power(single)
        assert set(point["agentic"]) == set(single["agentic"])
        assert point["completed"] == point["num_prompts"] > 0
        agentic_files = pytester.path / "inferbench-results" / "agentic"
        assert (agentic_files / f"{point['result_filename']}.json").is_file()
    # Two instances, each serving its sessions from its own prefix cache.
    for point, role in ((agg, "aggregated"), (disagg, "prefill")):
        metrics = point["server_metrics"]
        by_instance = metrics[role]["prefix_cache_hits_by_instance"]
        assert len(by_instance) == 2 and all(hits > 0 for hits in by_instance)
        assert sum(by_instance) == metrics["prefix_cache_hits"] > 0
    # The disaggregated point moves every prompt's KV to its decode instance, and its prefill
    # workers offload to the CPU-DRAM tier its total-cpu-dram-gb sizes.
    metrics = disagg["server_metrics"]
    # (the server's counts are every request's, the replay's warmup included)
    assert metrics["kv_transfers"] == disagg["agentic"]["request_accounting"]["records_total"]
    assert metrics["mean_kv_transfer_ms"] > 0
    assert metrics["kv_tiers"]["host_tokens_total"] > 0
    assert metrics["kv_tiers"]["offload_bytes_written"] > 0
    assert "kv_transfers" not in agg["server_metrics"]
    assert "kv_tiers" not in agg["server_metrics"]
