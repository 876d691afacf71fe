"""Inside a copy of InferenceX's repository, with no configuration at all: one short point of
every multinode (framework, runner) combination of both master files -- disaggregated
`*-disagg` and `dynamo-*` deployments on MI355X, B200, B300, H100, H200, GB200 and GB300, and
the aggregated `decode.num-worker: 0` one -- runs on the default backend, and a point that
fails fails on a gate, never on a missing launch spec or catalog entry, or an exception.

`benchmarks/bench_sim_speed.py --multinode DIR` runs every multinode point (without gates).
"""

from __future__ import annotations

from pathlib import Path

from pytest_inferbench.recipe import launch
from pytest_inferbench.recipe.model import BenchPoint
from pytest_inferbench.sim.args import argv_value
from pytest_inferbench.testing.inferencex import multinode_servers

from .gate_only import run_and_check


def sample(checkout: Path) -> list[str]:
    """The node id of each combination's lowest-concurrency point (shortest first), and of
    the aggregated entries' too."""
    chosen: dict[tuple[str, ...], BenchPoint] = {}
    for master in sorted((checkout / ".github" / "configs").glob("*-master.yaml")):
        for server in multinode_servers(master):
            assert server.decode is not None
            combo = (server.framework, server.runner,
                     "aggregated" if server.decode.num_worker == 0 else "")
            point = min(server.points(), key=lambda p: (p.conc, p.isl + p.osl))
            old = chosen.get(combo)
            if old is None or (point.conc, point.isl + point.osl) < (old.conc,
                                                                     old.isl + old.osl):
                chosen[combo] = point
    return [f"{p.server.source.relative_to(checkout)}::{p.server.node_name}::{p.name}"
            for p in chosen.values()]


def test_a_sample_of_every_multinode_combination_runs_and_fails_only_on_gates(
        inferencex_copy: Path) -> None:
    node_ids = sample(inferencex_copy)
    frameworks = {node_id.split("::")[1].split("-")[3] for node_id in node_ids}
    assert frameworks == {"atom", "dynamo", "sglang", "vllm"}
    assert any("-d0x" in node_id for node_id in node_ids)  # the aggregated deployment
    run_and_check(inferencex_copy, node_ids, timeout_s=900)


LOW_LATENCY = "CONFIG_FILE=recipes/gb200-fp8/1k1k/low-latency.yaml"


def test_a_recipe_file_with_known_settings_gives_both_pools_its_values(
        inferencex_copy: Path) -> None:
    """DSR1 FP8 at TP4 on GB200 (168 GB of weights per GPU) starts only with the memory
    fraction its srt-slurm recipe file sets (0.95); the file is named in the prefill pool's
    settings and configures the decode workers too."""
    master = inferencex_copy / ".github" / "configs" / "nvidia-master.yaml"
    servers = [s for s in multinode_servers(master) if s.prefill is not None
               and LOW_LATENCY in s.prefill.additional_settings]
    assert len(servers) == 1
    server = servers[0]
    spec = launch.resolve(server, inferencex_copy / "benchmarks" / "launch")
    workers = {role.name: role.argv for role in spec.roles if role.name in ("prefill", "decode")}
    assert set(workers) == {"prefill", "decode"}
    for argv in workers.values():
        assert argv_value(argv, "gpu_memory_utilization") == 0.95
        assert argv_value(argv, "max_model_len") == 2200  # the file's, after the spec's own
    assert argv_value(workers["decode"], "max_num_seqs") == 128
    point = min(server.points(), key=lambda p: p.conc)
    run_and_check(inferencex_copy, [
        f"{server.source.relative_to(inferencex_copy)}::{server.node_name}::{point.name}"],
        timeout_s=300)
