"""The agentic trace replay of a multinode deployment in process (`sim/cluster_replay.py`): the
single-engine replay's schedule driving a deployment's router, each session kept on the
instances its first request went to, each instance with its own prefix cache, a disaggregated
deployment's prompts computed on prefill instances and their KV moved to decode instances."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from trace_files import overflow_trace

from pytest_inferbench.loadgen.replay_prompts import prompt_tokens
from pytest_inferbench.loadgen.replay_schedule import ReplayConfig
from pytest_inferbench.loadgen.synthetic_traces import (
    SyntheticTraceSettings,
    write_synthetic_traces,
)
from pytest_inferbench.loadgen.trace_sessions import SessionTree, sessions
from pytest_inferbench.loadgen.traces import load_traces
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.cluster import Cluster
from pytest_inferbench.sim.cluster_replay import simulate_cluster_replay
from pytest_inferbench.sim.disagg import Deployment, Pool, kv_transfer
from pytest_inferbench.sim.engine import Engine, RequestRejectedError
from pytest_inferbench.sim.replay_driver import simulate_replay

if TYPE_CHECKING:
    from pytest_inferbench.sim.config import EngineConfig

MODEL = "amd/MiniMax-M3-MXFP4"


def _config(*extra: str) -> EngineConfig:
    config, _ = engine_config_from_argv(
        ["vllm", "serve", MODEL, "--tensor-parallel-size", "4", "--block-size", "16", *extra],
        hardware="MI355X")
    return config


def _trees(tmp_path: Path, traces: int = 4, subagents: int = 0) -> list[SessionTree]:
    settings = SyntheticTraceSettings(traces=traces, turns=5, subagents=subagents,
                                      output_tokens=64, think_time_s=1.0)
    return [sessions(t) for t in load_traces(write_synthetic_traces(tmp_path, settings))]


def _single_engine_hits(trees: list[SessionTree], lanes: int) -> int:
    """The prefix-cache hits of the same replay on one engine: every session's turns meet the
    blocks its earlier turns left."""
    out = simulate_replay(Engine(_config(), keep_traces=True), trees, lanes,
                          ReplayConfig(duration_s=60.0), chat=True)
    hits = out.server_metrics["prefix_cache_hits"]
    assert isinstance(hits, int) and hits > 0
    return hits


def test_one_aggregated_worker_replays_as_the_single_engine_does(tmp_path: Path) -> None:
    config = _config()
    trees = _trees(tmp_path)
    settings = ReplayConfig(duration_s=60.0)
    single = simulate_replay(Engine(config, keep_traces=True), trees, 3, settings, chat=True)
    # Its engine's seed differs from the single engine's: nothing here draws from it.
    deployed = simulate_cluster_replay(Deployment(Pool("aggregated", config, 1)), trees, 3,
                                       settings, chat=True)
    assert len(single.records) > 20
    assert deployed.requests == single.requests  # the schedule's requests in the same order
    for a, b in zip(deployed.records, single.records, strict=True):
        assert (a.input_tokens, a.output_tokens) == (b.input_tokens, b.output_tokens)
        assert a.send_time == pytest.approx(b.send_time, abs=1e-9)
        assert a.end_time == pytest.approx(b.end_time, abs=1e-9)
        assert a.chunk_times[0] == pytest.approx(b.chunk_times[0], abs=1e-9)
    for key in ("prefix_cache_queries", "prefix_cache_hits", "generation_tokens"):
        assert deployed.server_metrics[key] == single.server_metrics[key]
    # Lengths are the trace's: the prompt as the chat replay renders it, max_tokens recorded.
    assert [(r.input_tokens, r.output_tokens) for r in deployed.records] == [
        (prompt_tokens(q.input_length, chat=True), q.output_length) for q in deployed.requests]


def test_sessions_stay_on_their_instance_and_hit_its_prefix_cache(tmp_path: Path) -> None:
    config = _config()
    trees = _trees(tmp_path, traces=4)
    deployment = Deployment(Pool("aggregated", config, 2), router="round-robin")
    out = simulate_cluster_replay(deployment, trees, 4, ReplayConfig(duration_s=60.0),
                                  chat=True)
    assert out.records and all(r.success for r in out.records)
    metrics = out.server_metrics
    # Every turn finds what its session's earlier turns left in the cache of its instance:
    # as many hits as on one engine that holds them all.
    assert metrics["prefix_cache_hits"] == _single_engine_hits(trees, 4)
    assert metrics["prefix_cache_queries"] == sum(r.input_tokens for r in out.records)
    # Both instances served sessions and hit their own caches.
    part = metrics["aggregated"]
    assert isinstance(part, dict)
    by_instance = part["prefix_cache_hits_by_instance"]
    assert isinstance(by_instance, list) and len(by_instance) == 2
    assert all(hits > 0 for hits in by_instance) and sum(by_instance) == part[
        "prefix_cache_hits"]


def test_a_session_is_routed_where_its_first_request_went() -> None:
    cluster = Cluster(Deployment(Pool("aggregated", _config(), 3), router="round-robin"))
    cluster.add_request(1, 100, 8, session="a")
    cluster.add_request(2, 100, 8, session="b")
    cluster.add_request(3, 100, 8, session="a")
    cluster.add_request(4, 100, 8)  # no session: the router's turn
    placed = {rid: i for i, inst in enumerate(cluster.instances)
              for rid in inst.engine.requests}
    assert placed[1] == placed[3] == 0
    assert placed[2] == 1 and placed[4] == 2


def test_a_disaggregated_replay_computes_prompts_on_prefill_and_moves_their_kv(
        tmp_path: Path) -> None:
    prefill = _config()
    decode = _config()
    deployment = Deployment(Pool("prefill", prefill, 2), Pool("decode", decode, 1))
    trees = _trees(tmp_path, traces=3)
    out = simulate_cluster_replay(deployment, trees, 3, ReplayConfig(duration_s=60.0),
                                  chat=True)
    served = [r for r in out.records if r.success]
    assert len(served) == len(out.records) > 10
    metrics = out.server_metrics
    assert metrics["deployment"] == deployment.topology
    # Every prompt was computed on a prefill instance, whose caches hit what one engine's does.
    assert metrics["prefix_cache_hits"] == _single_engine_hits(trees, 3)
    prefill_part = metrics["prefill"]
    assert isinstance(prefill_part, dict)
    assert prefill_part["prefix_cache_hits"] == metrics["prefix_cache_hits"]
    # ... and its KV moved to the decode instance, priced as the fixed-length path prices it.
    transfer = kv_transfer(deployment)
    assert transfer is not None
    assert metrics["kv_transfers"] == len(served)
    cheapest = min(transfer.seconds(r.input_tokens, np.inf) for r in served)
    assert metrics["mean_kv_transfer_ms"] >= cheapest * 1e3 > 0
    # The first token waits for the transfer: no TTFT shorter than the cheapest move.
    assert min(r.chunk_times[0] - r.send_time for r in served) > cheapest


def test_requests_the_deployment_cannot_run_stop_the_replay_saying_why(tmp_path: Path) -> None:
    small = _config("--max-model-len", "1200")
    deployment = Deployment(Pool("aggregated", small, 2))
    with pytest.raises(RequestRejectedError, match="maximum context length"):
        simulate_cluster_replay(deployment, _trees(tmp_path, traces=2), 2,
                                ReplayConfig(duration_s=30.0), chat=True)


def test_a_root_warmup_request_the_deployment_refuses_aborts_its_replay(
        tmp_path: Path) -> None:
    """As the single engine's replay: t* before the overflowing third turn, so the warmup
    sends it, the deployment refuses it, and the replay stops before profiling."""
    tree = sessions(load_traces(overflow_trace(tmp_path))[0])
    deployment = Deployment(Pool("aggregated", _config("--max-model-len", "1000"), 1))
    with pytest.raises(RequestRejectedError, match="warmup request of root stream overflow"):
        simulate_cluster_replay(deployment, [tree], 1,
                                ReplayConfig(duration_s=30.0, trajectory_start=(0.25, 0.5)),
                                chat=True)
