"""Inside a copy of InferenceX's repository, with no configuration at all: one short point of
every single-node (model family, precision, framework, GPU, speculative decoding) combination
of both master files runs on the default backend, and a point that fails fails on a gate,
never on a missing launch spec or catalog entry, or an exception.

`benchmarks/bench_sim_speed.py --matrix DIR` runs every point of the matrix (without gates).
"""

from __future__ import annotations

from pathlib import Path

from pytest_inferbench.recipe.model import BenchPoint
from pytest_inferbench.testing.inferencex import single_node_servers

from .gate_only import run_and_check


def sample(checkout: Path) -> list[str]:
    """The node id of each combination's shortest point at its lowest concurrency."""
    chosen: dict[tuple[str, ...], BenchPoint] = {}
    for master in sorted((checkout / ".github" / "configs").glob("*-master.yaml")):
        for server in single_node_servers(master):
            combo = (server.model_prefix, server.precision, server.framework, server.hardware,
                     server.spec_decoding)
            point = min(server.points(), key=lambda p: (p.isl + p.osl, p.conc))
            old = chosen.get(combo)
            if old is None or (point.isl + point.osl, point.conc) < (old.isl + old.osl,
                                                                       old.conc):
                chosen[combo] = point
    return [f"{p.server.source.relative_to(checkout)}::{p.server.node_name}::{p.name}"
            for p in chosen.values()]


def test_a_sample_of_every_combination_runs_and_fails_only_on_gates(
        inferencex_copy: Path) -> None:
    node_ids = sample(inferencex_copy)
    families = {node_id.split("::")[1].split("-")[0] for node_id in node_ids}
    assert families == {"dsr1", "dsv4", "glm5", "glm5.1", "gptoss", "kimik2.5", "minimaxm3",
                        "qwen3.5"}
    frameworks = {node_id.split("::")[1].split("-")[3] for node_id in node_ids}
    assert frameworks == {"atom", "sglang", "trt", "vllm"}
    run_and_check(inferencex_copy, node_ids, timeout_s=600)
