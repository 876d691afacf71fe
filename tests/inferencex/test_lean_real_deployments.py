"""On InferenceX's own multinode entries, a disaggregated point run on lean instances
(`PrefillInstance`, `DecodeInstance`) is the point run on engines to the last bit: one point of
each (framework, runner, speculative or not) combination, with the launch specs, parallelism,
recipe settings and models of the real master files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pytest_inferbench.backends.base import StartContext
from pytest_inferbench.backends.sim import SimBackend, SimHandle
from pytest_inferbench.loadgen.prompts import point_workload
from pytest_inferbench.loadgen.workload import LoadSettings
from pytest_inferbench.recipe.launch import resolve
from pytest_inferbench.recipe.model import BenchPoint
from pytest_inferbench.sim.cluster import Cluster
from pytest_inferbench.sim.cluster_driver import _simulate, simulate_deployment_point
from pytest_inferbench.testing.inferencex import multinode_servers


def combinations(checkout: Path) -> dict[tuple[str, str, bool], BenchPoint]:
    """The lowest-concurrency disaggregated point of each combination."""
    chosen: dict[tuple[str, str, bool], BenchPoint] = {}
    for master in sorted((checkout / ".github" / "configs").glob("*-master.yaml")):
        for server in multinode_servers(master):
            assert server.decode is not None
            if server.decode.num_worker == 0:
                continue  # aggregated: its instances are engines
            combo = (server.framework, server.runner, "mtp" in server.node_name)
            point = min(server.points(), key=lambda p: (p.conc, p.isl + p.osl))
            old = chosen.get(combo)
            if old is None or (point.conc, point.isl + point.osl) < (old.conc,
                                                                     old.isl + old.osl):
                chosen[combo] = point
    return chosen


def test_lean_instances_are_engines_on_the_real_master_files(
        inferencex_dir: Path, tmp_path: Path) -> None:
    chosen = combinations(inferencex_dir)
    assert {framework for framework, _, _ in chosen} == {
        "atom-disagg", "sglang-disagg", "vllm-disagg", "dynamo-sglang", "dynamo-trt",
        "dynamo-vllm"}
    assert any(drafts for _, _, drafts in chosen)
    context = StartContext(results_dir=tmp_path, run_id="lean", worker_id="master",
                           options=None)
    for point in chosen.values():
        server = point.server
        handle = SimBackend().start(server, resolve(server, Path(server.source).parent
                                                    / "launch"), context)
        assert isinstance(handle, SimHandle) and handle.deployment is not None
        workload = point_workload(point.isl, point.osl, point.conc, LoadSettings(),
                                  handle.client, prompts=point.prompts)
        # Straight on lean instances: a decline would raise here.
        lean = _simulate(Cluster(handle.deployment, lean=True), workload, warmup_shortcut=True)
        engines = simulate_deployment_point(handle.deployment, workload, lean=False)
        where = f"{server.node_name}::{point.name}"
        assert lean.duration_s == engines.duration_s, where
        assert lean.server_metrics == engines.server_metrics, where
        assert len(lean.records) == len(engines.records) == len(workload.requests), where
        for a, b in zip(lean.records, engines.records, strict=True):
            np.testing.assert_array_equal(a.chunk_times, b.chunk_times, err_msg=where)
            np.testing.assert_array_equal(a.chunk_tokens, b.chunk_tokens, err_msg=where)
