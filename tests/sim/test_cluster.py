"""Multinode deployments: the cluster composes the ordinary engine, and a disaggregated
request's first token is exactly its prefill, its KV transfer and its decode admission."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_inferbench.loadgen.workload import LoadSettings, build_workload
from pytest_inferbench.results.metrics import StepRecords, summarize
from pytest_inferbench.sim.acceptance import SpecConfig
from pytest_inferbench.sim.cluster import Cluster
from pytest_inferbench.sim.cluster_driver import (
    _record_per_request,
    _run_load,
    _warmup_leaves_no_trace,
    client_records,
    simulate_deployment_point,
)
from pytest_inferbench.sim.config import EngineConfig
from pytest_inferbench.sim.disagg import Deployment, DeploymentError, Pool, Router, kv_transfer
from pytest_inferbench.sim.driver import simulate_point
from pytest_inferbench.sim.engine import Engine

M3 = EngineConfig(hardware="MI355X", model="amd/MiniMax-M3-MXFP4", framework="vllm", tp=4,
                  kv_cache_dtype="fp8", block_size=128, max_num_batched_tokens=16384,
                  max_model_len=10000, max_num_seqs=32)
EAGLE = SpecConfig(method="eagle3", draft_model="Inferact/MiniMax-M3-EAGLE3",
                   num_speculative_tokens=3, acceptance_length=2.6)


@pytest.mark.parametrize(("conc", "rate"), [(4, None), (48, None), (16, 3.0)])
def test_one_aggregated_worker_is_the_single_engine(conc: int, rate: float | None) -> None:
    load = LoadSettings(request_rate=rate) if rate else LoadSettings()
    workload = build_workload(8192, 1024, conc, load)
    cluster = simulate_deployment_point(Deployment(Pool("aggregated", M3, 1)), workload)
    single = simulate_point(M3, workload)
    assert cluster.duration_s == pytest.approx(single.duration_s, rel=1e-12)
    assert len(cluster.records) == len(single.records) == len(workload.requests)
    for a, b in zip(cluster.records, single.records, strict=True):
        assert a.send_time == pytest.approx(b.send_time, abs=1e-9)
        np.testing.assert_allclose(a.chunk_times, b.chunk_times, rtol=1e-12)
        np.testing.assert_array_equal(a.chunk_tokens, b.chunk_tokens)
    for key in ("prompt_tokens", "generation_tokens", "preemptions", "engine_steps"):
        assert cluster.server_metrics[key] == single.server_metrics[key], key


def test_a_request_whose_kv_arrived_computes_nothing_and_samples_its_first_token() -> None:
    engine = Engine(M3)
    prompt = 8000
    engine.add_request(1, prompt, 5, kv_ready=True)
    first = engine.step()
    # One sampled row reading its context, no prompt token computed.
    cost = engine.cost.step(decode_seqs=0.0, decode_ctx=0.0, decode_ctx_win=0.0,
                            prefill_tokens=0.0, prefill_seqs=1.0, prefill_ctx=float(prompt),
                            prefill_ctx_win=float(min(prompt, engine.window)))
    assert first.duration_s == pytest.approx(float(cost))
    assert first.emitted == [(1, 1)]
    assert engine.num_blocks - engine.free_blocks == math.ceil(prompt / M3.block_size)
    prefilled = Engine(M3)
    prefilled.add_request(1, prompt, 5)
    assert prefilled.step().duration_s > 20 * first.duration_s
    tokens = 1
    while engine.has_work():
        tokens += sum(n for _, n in engine.step().emitted)
    assert tokens == 5


def test_first_token_is_prefill_then_transfer_then_decode_admission() -> None:
    dep = Deployment(Pool("prefill", M3, 1), Pool("decode", M3, 1))
    prompt = 8000
    cluster = Cluster(dep)
    cluster.add_request(7, prompt, 3)
    while cluster.has_work():
        cluster.advance()
    trace = cluster.pop_trace(7)
    alone = Engine(M3)
    alone.add_request(7, prompt, 1)
    prefill_s = alone.step().duration_s
    transfer = kv_transfer(dep)
    assert transfer is not None and transfer.fabric == "scale-up"  # 8 GPUs: one MI355X node
    decode = Engine(M3)
    decode.add_request(7, prompt, 3, kv_ready=True)
    admit_s = decode.step().duration_s
    assert trace.transfer_s == pytest.approx(transfer.seconds(prompt, prefill_s))
    assert trace.times[0] == pytest.approx(prefill_s + trace.transfer_s + admit_s)
    assert list(trace.tokens) == [1, 1, 1]
    # The transferred bytes: each of the 4 GPUs holds one of MiniMax-M3's 4 KV heads (fp8)
    # of 60 layers, and the indexer keys (every 4th of the 57 sparse layers, 128 fp8 each).
    per_gpu = 60 * 2 * 128 + 57 / 4 * 128
    assert transfer.bytes_per_token == pytest.approx(per_gpu)


def test_routers() -> None:
    assert [Router("round-robin", 3, 1).pick(0, [0, 0, 0]) for _ in range(1)] == [0]
    rr = Router("round-robin", 3, 2)
    assert [rr.pick(0, [9.0, 0.0, 0.0]) for _ in range(4)] == [0, 1, 2, 0]
    least = Router("load-aware", 3, 2)
    assert least.pick(0, [5.0, 1.0, 3.0]) == 1
    assert least.pick(0, [0.0, 0.0, 0.0]) == 2  # ties go in turn, after the last pick
    a, b = Router("random", 4, 1, seed=3), Router("random", 4, 1, seed=3)
    picks = [a.pick(0, []) for _ in range(50)]
    assert picks == [b.pick(0, []) for _ in range(50)] and set(picks) == {0, 1, 2, 3}
    with pytest.raises(DeploymentError, match="router policy 'sticky' unknown"):
        Deployment(Pool("aggregated", M3, 1), router="sticky")


def test_load_aware_routing_spreads_what_round_robin_piles_up() -> None:
    # Two prefill workers; prompts alternate long and short, so round-robin sends every long
    # prompt to the same worker while load-aware balances the prompt tokens.
    small = EngineConfig(**{**M3.__dict__, "max_num_batched_tokens": 2048})
    waits = {}
    for policy in ("round-robin", "load-aware"):
        cluster = Cluster(Deployment(Pool("prefill", small, 2), Pool("decode", M3, 1),
                                     router=policy))
        for rid in range(16):
            cluster.add_request(rid, 8000 if rid % 2 == 0 else 500, 2)
        while cluster.has_work():
            cluster.advance()
        waits[policy] = max(float(cluster.pop_trace(rid).times[0]) for rid in range(16))
    assert waits["load-aware"] < 0.8 * waits["round-robin"]


@pytest.mark.parametrize(("prefill", "decode", "conc", "rate", "extra"), [
    (1, 6, 12, None, {}), (2, 3, 48, None, {}), (1, 4, 16, 2.0, {}), (2, 1, 96, None, {}),
    (1, 3, 24, None, {"spec": EAGLE}), (1, 3, 24, None, {"jitter": 0.1})])
def test_stretches_give_the_token_times_of_stepping_one_step_at_a_time(
        prefill: int, decode: int, conc: int, rate: float | None, extra: dict[str, object]
) -> None:
    # Stretches priced to each instance's next finish and cut where a request reaches it
    # give the same token times as every instance stepping one step at a time (speculative
    # plans and the jitter stream included: a cut stretch draws only its own steps' jitter).
    config = EngineConfig(**{**M3.__dict__, "max_num_seqs": 64, **extra})
    dep = Deployment(Pool("prefill", config, prefill), Pool("decode", config, decode),
                     router="random")
    load = LoadSettings(request_rate=rate) if rate else LoadSettings(prompts_per_conc=2)
    workload = build_workload(1024, 256, conc, load)
    plain, fast = (simulate_deployment_point(dep, workload, stretch=s) for s in (False, True))
    assert len(plain.records) == len(fast.records) == len(workload.requests)
    for a, b in zip(plain.records, fast.records, strict=True):
        np.testing.assert_allclose(a.chunk_times, b.chunk_times, rtol=1e-9, atol=0)
        np.testing.assert_array_equal(a.chunk_tokens, b.chunk_tokens)
        assert a.send_time == pytest.approx(b.send_time, rel=1e-9)
    for key in ("engine_steps", "generation_tokens", "preemptions", "max_kv_cache_usage"):
        assert fast.server_metrics[key] == plain.server_metrics[key], key


@pytest.mark.parametrize(("pools", "router", "extra"), [
    ((1, 3), "round-robin", {"spec": EAGLE}), ((2, 3), "random", {"spec": EAGLE}),
    ((2, 1), "round-robin", {}), ((3,), "round-robin", {"spec": EAGLE}),
    ((2, 2), "load-aware", {"spec": EAGLE})])
def test_a_warmup_that_leaves_no_trace_is_not_run(
        pools: tuple[int, ...], router: str, extra: dict[str, object]) -> None:
    # Skipped, it leaves what running it leaves: the router's turns and every instance's
    # acceptance stream moved on by the plans of the requests it was given. A router that
    # reads loads picks by the warmup's timing: that warmup runs.
    config = EngineConfig(**{**M3.__dict__, "max_num_seqs": 64, **extra})
    roles = ("prefill", "decode") if len(pools) > 1 else ("aggregated",)
    dep = Deployment(*(Pool(role, config, n) for role, n in zip(roles, pools, strict=True)),
                     router=router)
    workload = build_workload(1024, 256, 24, LoadSettings(prompts_per_conc=2))
    warm_isl, warm_osl = workload.warmup_length_arrays
    assert _warmup_leaves_no_trace(Cluster(dep), warm_isl, warm_osl, 24) == (
        router != "load-aware")
    ran, skipped = (simulate_deployment_point(dep, workload, warmup_shortcut=s)
                    for s in (False, True))
    assert len(ran.records) == len(skipped.records) == len(workload.requests)
    for a, b in zip(ran.records, skipped.records, strict=True):
        np.testing.assert_allclose(a.chunk_times, b.chunk_times, rtol=1e-9, atol=1e-9)
        np.testing.assert_array_equal(a.chunk_tokens, b.chunk_tokens)
    assert skipped.duration_s == pytest.approx(ran.duration_s, rel=1e-9)
    for key in ("engine_steps", "generation_tokens", "prompt_tokens", "max_kv_cache_usage",
                "spec_num_accepted_tokens", "spec_accepted_histogram"):
        assert skipped.server_metrics.get(key) == ran.server_metrics.get(key), key


@pytest.mark.parametrize(("pools", "extra"), [
    ((1, 3), {}), ((2, 3), {"spec": EAGLE}), ((2,), {"spec": EAGLE})])
def test_records_are_columns_over_the_streaming_instances_timelines(
        pools: tuple[int, ...], extra: dict[str, object]) -> None:
    # Each request's chunks lie on consecutive steps of the instance that streamed them, so
    # the records are columns over those instances' timelines laid end to end: each record
    # reads from them exactly the times its own trace reads from its instance's timeline,
    # and the point summarizes as those per-request records do.
    config = EngineConfig(**{**M3.__dict__, "max_num_seqs": 64, **extra})
    roles = ("prefill", "decode") if len(pools) > 1 else ("aggregated",)
    dep = Deployment(*(Pool(role, config, n) for role, n in zip(roles, pools, strict=True)))
    workload = build_workload(1024, 256, 24, LoadSettings(prompts_per_conc=2))
    isl, osl = workload.input_lens, workload.output_lens
    cluster = Cluster(dep, lean=len(pools) > 1)
    done = _run_load(cluster, isl, osl, np.zeros(len(isl)), 24, first_id=0)
    t0 = 0.5  # any origin: both subtract it
    drafting = "spec" in extra
    columns = client_records(done, isl, None, t0, drafting)
    own = _record_per_request(done, isl, None, t0, drafting)
    assert isinstance(columns, StepRecords)
    assert len({id(trace.timeline) for _, _, trace in done}) == pools[-1]
    for a, b in zip(columns, own, strict=True):
        assert (a.send_time, a.output_tokens) == (b.send_time, b.output_tokens)
        np.testing.assert_array_equal(a.chunk_times, b.chunk_times)
        np.testing.assert_array_equal(a.chunk_tokens, b.chunk_tokens)
    args = {"duration_s": cluster.now - t0, "num_prompts": len(own), "max_concurrency": 24,
            "num_gpus": 8}
    summary, plain = summarize(columns, **args), summarize(own, **args)
    assert summary.keys() == plain.keys()
    for key, value in plain.items():
        if isinstance(value, float):
            assert summary[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
        else:
            assert summary[key] == value, key


def test_a_request_whose_run_of_steps_broke_off_gets_its_own_record() -> None:
    # A decode cache of a few requests' worth: the engine preempts, a preempted request's
    # chunks are no run of consecutive steps, and the point's records are one per request.
    config = EngineConfig(**{**M3.__dict__, "max_num_seqs": 64, "kv_cache_free_fraction": 0.002})
    dep = Deployment(Pool("prefill", config, 1), Pool("decode", config, 1))
    workload = build_workload(1024, 256, 24, LoadSettings(prompts_per_conc=2))
    point = simulate_deployment_point(dep, workload)
    assert point.server_metrics["preemptions"] > 0
    assert not isinstance(point.records, StepRecords)
    assert len(point.records) == len(workload.requests)
