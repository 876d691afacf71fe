"""A disaggregated deployment's lean instances (`PrefillInstance`, `DecodeInstance` from per-step
sums) give exactly the token times, token counts and counters of engine-backed instances, and
decline where the engine would preempt."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pytest_inferbench.loadgen.workload import LoadSettings, build_workload
from pytest_inferbench.sim.acceptance import SpecConfig
from pytest_inferbench.sim.cluster import Cluster
from pytest_inferbench.sim.cluster_driver import _simulate, simulate_deployment_point
from pytest_inferbench.sim.config import EngineConfig
from pytest_inferbench.sim.disagg import Deployment, Pool
from pytest_inferbench.sim.engine import Engine
from pytest_inferbench.sim.instance import Declined

M3 = EngineConfig(hardware="MI355X", model="amd/MiniMax-M3-MXFP4", framework="vllm", tp=4,
                  kv_cache_dtype="fp8", block_size=16, max_num_batched_tokens=8192,
                  max_model_len=10000, max_num_seqs=64)
EAGLE = SpecConfig(method="eagle3", draft_model="Inferact/MiniMax-M3-EAGLE3",
                   num_speculative_tokens=3, acceptance_length=2.6)
GPTOSS = EngineConfig(hardware="H200", model="openai/gpt-oss-120b", framework="vllm", tp=1,
                      max_num_seqs=64, max_num_batched_tokens=8192)



def room_for(config: EngineConfig, tokens: int) -> EngineConfig:
    """The config with a KV cache of about `tokens` (the cache is linear in the fraction)."""
    whole = Engine(replace(config, kv_cache_free_fraction=1.0)).kv_capacity_tokens
    return replace(config, kv_cache_free_fraction=tokens / whole)


CASES = {
    # name: (decode config, prefill workers, decode workers, isl, osl, conc, router, load)
    "plain": (M3, 1, 2, 1024, 256, 48, "round-robin", {}),
    "eagle3": (replace(M3, spec=EAGLE), 2, 3, 1024, 256, 48, "random", {}),
    "sliding-window": (GPTOSS, 1, 2, 2000, 300, 32, "round-robin", {}),
    "odd-block-size": (replace(M3, block_size=7, spec=EAGLE), 1, 1, 1000, 200, 16,
                       "round-robin", {}),
    "page-size-one": (replace(M3, block_size=1), 1, 1, 700, 150, 8, "round-robin", {}),
    "queue-behind-max-num-seqs": (replace(M3, max_num_seqs=5), 2, 2, 512, 128, 24,
                                  "load-aware", {}),
    "one-token-replies": (M3, 1, 2, 300, 1, 16, "round-robin", {}),
    # Room for three of these requests: arrivals wait for blocks, decoders never outgrow it.
    "admissions-wait-for-blocks": (room_for(M3, 7000), 1, 1, 2000, 8, 16, "round-robin", {}),
    # A prefill cache of about one prompt and a budget of half of one: chunks are cut to the
    # blocks left and admissions wait for them.
    "prefill-waits-for-blocks": (M3, 1, 2, 2000, 64, 16, "round-robin", {}),
    "open-loop": (replace(M3, spec=EAGLE), 1, 2, 1024, 128, 32, "round-robin",
                  {"request_rate": 20.0}),
    "many-decoders": (M3, 1, 9, 1024, 64, 96, "round-robin", {"prompts_per_conc": 2}),
}


@pytest.mark.parametrize("case", CASES)
def test_lean_instances_are_engine_instances(case: str) -> None:
    decode, prefills, decoders, isl, osl, conc, router, load = CASES[case]
    prefill = replace(decode, spec=None, kv_cache_free_fraction=None)
    if case == "prefill-waits-for-blocks":
        prefill = replace(room_for(M3, 2500), max_num_batched_tokens=1024)
    dep = Deployment(Pool("prefill", prefill, prefills), Pool("decode", decode, decoders),
                     router=router)
    workload = build_workload(isl, osl, conc, LoadSettings(
        **{"prompts_per_conc": 3, "warmup_per_conc": 1, **load}))  # type: ignore[arg-type]
    lean = _simulate(Cluster(dep, lean=True), workload, warmup_shortcut=True)
    engines = simulate_deployment_point(dep, workload, lean=False)
    # The same float operations in the same order: equal to the last bit.
    assert lean.duration_s == engines.duration_s
    assert len(lean.records) == len(engines.records) == len(workload.requests)
    for a, b in zip(lean.records, engines.records, strict=True):
        assert a.send_time == b.send_time
        np.testing.assert_array_equal(a.chunk_times, b.chunk_times)
        np.testing.assert_array_equal(a.chunk_tokens, b.chunk_tokens)
    assert lean.server_metrics == engines.server_metrics
    if case == "admissions-wait-for-blocks":
        assert lean.server_metrics["decode"]["max_num_requests_waiting"] > 0  # type: ignore[index]


def test_where_the_engine_would_preempt_it_declines_and_the_point_runs_on_engines() -> None:
    # A decode cache of a few requests' worth: decoders outgrow it, and the engine preempts.
    small = room_for(M3, 5000)
    dep = Deployment(Pool("prefill", M3, 1), Pool("decode", small, 1))
    workload = build_workload(1024, 512, 32, LoadSettings(prompts_per_conc=2))
    with pytest.raises(Declined):
        _simulate(Cluster(dep, lean=True), workload, warmup_shortcut=True)
    point = simulate_deployment_point(dep, workload)
    engines = simulate_deployment_point(dep, workload, lean=False)
    assert point.server_metrics["preemptions"] > 0
    assert point.server_metrics == engines.server_metrics
    for a, b in zip(point.records, engines.records, strict=True):
        np.testing.assert_array_equal(a.chunk_times, b.chunk_times)


def test_lean_instances_refuse_an_abort() -> None:
    # Only a served deployment aborts requests, and it runs on engines.
    cluster = Cluster(Deployment(Pool("prefill", M3, 1), Pool("decode", M3, 1)), lean=True)
    cluster.add_request(1, 100, 10)
    with pytest.raises(RuntimeError, match="lean"):
        cluster.abort_request(1)
