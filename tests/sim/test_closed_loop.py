"""The closed loop planned in step space gives the figures of the engine run step by step:
every request's token times and counts, the duration and every server counter, across plain
and speculative decoding, sliding windows, chunked prefill, a queue behind max_num_seqs,
one-token replies and jitter; where the KV cache runs short the planner declines."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pytest_inferbench.loadgen.workload import LoadSettings, build_workload
from pytest_inferbench.sim.closed_loop import fits_whole, plan_closed_loop
from pytest_inferbench.sim.config import EngineConfig, SpecConfig
from pytest_inferbench.sim.driver import SimulatedPoint, _warmup_leaves_no_trace, simulate_point
from pytest_inferbench.sim.engine import Engine

M3 = EngineConfig(hardware="MI355X", model="amd/MiniMax-M3-MXFP4", framework="atom", tp=4,
                  max_num_seqs=64, max_num_batched_tokens=8192, block_size=16,
                  gpu_memory_utilization=0.8, kv_cache_dtype="fp8")
EAGLE = SpecConfig(method="eagle3", draft_model="Inferact/MiniMax-M3-EAGLE3",
                   num_speculative_tokens=3)
GPTOSS = EngineConfig(hardware="H200", model="openai/gpt-oss-120b", framework="vllm", tp=1,
                      max_num_seqs=64, max_num_batched_tokens=8192)
LOAD = LoadSettings(prompts_per_conc=4, warmup_per_conc=1)

CASES = {
    "plain": (M3, 1024, 256, 16),
    "eagle3": (replace(M3, spec=EAGLE), 1024, 256, 16),
    "sliding-window": (GPTOSS, 1024, 256, 16),
    # Blocks held grow by a staircase: a block size that is no power of two, and pages of one.
    "odd-block-size": (replace(M3, block_size=7), 1000, 200, 16),
    "page-size-one": (replace(GPTOSS, block_size=1), 700, 150, 8),
    "eagle3-page-size-one": (replace(M3, spec=EAGLE, block_size=1), 1024, 256, 16),
    "chunked-prefill": (replace(M3, max_num_batched_tokens=2048), 6000, 64, 8),
    "queue-behind-max-num-seqs": (replace(M3, max_num_seqs=5), 512, 128, 12),
    "one-token-replies": (M3, 300, 1, 8),
    "jitter": (replace(M3, spec=EAGLE, jitter=0.05, seed=3), 512, 128, 8),
}


def with_room_for(config: EngineConfig, tokens: int) -> EngineConfig:
    """The config with a KV cache of about `tokens`: the cache grows linearly with the memory
    utilization (what HBM x utilization leaves after fixed needs, per token of context)."""
    u = config.gpu_memory_utilization
    cap = Engine(config).kv_capacity_tokens
    per_utilization = (cap - Engine(replace(config, gpu_memory_utilization=u - 0.05)
                              ).kv_capacity_tokens) / 0.05
    return replace(config, gpu_memory_utilization=u - (cap - tokens) / per_utilization)


def lengths(isl: int, osl: int, conc: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    workload = build_workload(isl, osl, conc, LOAD)
    return (np.asarray([r.input_tokens for r in workload.requests], np.int64),
            np.asarray([r.output_tokens for r in workload.requests], np.int64),
            np.zeros(len(workload.requests)))


def both(config: EngineConfig, isl: int, osl: int, conc: int
         ) -> tuple[SimulatedPoint, SimulatedPoint]:
    workload = build_workload(isl, osl, conc, LOAD)
    return (simulate_point(config, workload, plan=True),
            simulate_point(config, workload, plan=False))


def assert_same(planned: SimulatedPoint, stepped: SimulatedPoint) -> None:
    # Times agree to rounding (the clock sums the same durations in other groupings).
    assert planned.duration_s == pytest.approx(stepped.duration_s, rel=1e-12)
    assert len(planned.records) == len(stepped.records)
    for a, b in zip(planned.records, stepped.records, strict=True):
        assert (a.input_tokens, a.output_tokens) == (b.input_tokens, b.output_tokens)
        assert a.chunk_tokens.tolist() == b.chunk_tokens.tolist()
        np.testing.assert_allclose(a.chunk_times, b.chunk_times, rtol=1e-12)
        assert a.send_time == pytest.approx(b.send_time, rel=1e-12)
    assert planned.server_metrics.keys() == stepped.server_metrics.keys()
    for key, value in stepped.server_metrics.items():
        if isinstance(value, (int, float)):
            assert planned.server_metrics[key] == pytest.approx(value, rel=1e-12), key
        else:  # pytest >= 9.2 refuses a relative tolerance on strings
            assert planned.server_metrics[key] == value, key


@pytest.mark.parametrize("case", list(CASES))
def test_planned_closed_loop_equals_the_engine_step_by_step(case: str) -> None:
    config, isl, osl, conc = CASES[case]
    assert plan_closed_loop(Engine(config), *lengths(isl, osl, conc), conc, None) is not None
    planned, stepped = both(config, isl, osl, conc)
    assert_same(planned, stepped)
    assert planned.server_metrics["engine_steps"] > 0


# Plain decoding where the KV cache runs short: admissions wait for blocks, a prefill chunk
# waits until its blocks are free, decoders are preempted (a waiting prefill too) and
# recompute later.
TIGHT = 8 * 2400  # room for about eight of the 2000/400 requests at once
SHORT_CASES = {
    "blocks-of-16": (with_room_for(M3, TIGHT), 2000, 400, 32),
    "pages-of-one": (with_room_for(replace(M3, block_size=1), TIGHT), 2000, 400, 32),
    "odd-block-size": (with_room_for(replace(M3, block_size=7), TIGHT), 2000, 400, 32),
    "sliding-window": (with_room_for(GPTOSS, TIGHT), 2000, 400, 32),
    "stuck-chunked-prefills": (with_room_for(replace(M3, max_num_batched_tokens=2048), 17_000),
                               8000, 200, 6),
    "queue-behind-max-num-seqs": (with_room_for(replace(M3, max_num_seqs=5), 3 * 2400),
                                  2000, 400, 12),
    "jitter": (with_room_for(replace(M3, jitter=0.05, seed=3), TIGHT), 2000, 400, 32),
    "one-token-replies": (with_room_for(M3, 2 * 300), 300, 1, 8),
}


@pytest.mark.parametrize("case", list(SHORT_CASES))
def test_where_the_cache_runs_short_the_plan_preempts_as_the_engine(case: str) -> None:
    config, isl, osl, conc = SHORT_CASES[case]
    assert plan_closed_loop(Engine(config), *lengths(isl, osl, conc), conc, None) is not None
    planned, stepped = both(config, isl, osl, conc)
    assert_same(planned, stepped)
    metrics = stepped.server_metrics
    if case == "one-token-replies":  # nothing decodes: admissions wait for the blocks
        assert metrics["max_num_requests_waiting"] > 0 and metrics["preemptions"] == 0
    else:
        assert metrics["preemptions"] > 0 and metrics["max_kv_cache_usage"] > 0.9


def test_with_drafts_a_cache_that_runs_short_is_left_to_the_engine() -> None:
    # A preempted request draws a new decode plan when readmitted: the engine runs it.
    config = with_room_for(replace(M3, spec=EAGLE), TIGHT)
    isl, osl, arrivals = lengths(2000, 400, 32)
    engine = Engine(config)
    assert plan_closed_loop(engine, isl, osl, arrivals, 32, None) is None
    assert engine.steps_done == 0 and engine.counters().generation_tokens == 0  # untouched
    planned, stepped = both(config, 2000, 400, 32)
    assert stepped.server_metrics["preemptions"] > 0
    assert_same(planned, stepped)


SHORT_CACHE_CASES = {
    "kv-cache-runs-short": (with_room_for(replace(M3, spec=EAGLE), TIGHT), 2000, 400, 32),
    "kv-cache-runs-short-without-drafts": SHORT_CASES["blocks-of-16"],
}


@pytest.mark.parametrize("case", [*CASES, *SHORT_CACHE_CASES])
def test_a_warmup_that_leaves_no_trace_is_not_run_and_changes_nothing(case: str) -> None:
    # A warmup changes nothing but where the acceptance draws stand: the measured phase is
    # the same whether it ran or was skipped. With drafts, where the cache runs short (a
    # preempted warmup request draws again), or where jitter draws per step, it runs.
    config, isl, osl, conc = {**CASES, **SHORT_CACHE_CASES}[case]
    load = replace(LOAD, warmup_per_conc=2)
    workload = build_workload(isl, osl, conc, load)
    skipped = simulate_point(config, workload)
    ran = simulate_point(config, workload, warmup_shortcut=False)
    assert_same(skipped, ran)
    if case in SHORT_CACHE_CASES:
        assert ran.server_metrics["preemptions"] > 0
    leaves_no_trace = _warmup_leaves_no_trace(Engine(config), *workload.warmup_length_arrays,
                                              conc)
    assert leaves_no_trace == (case not in ("jitter", "kv-cache-runs-short"))


def test_several_decoders_preempted_in_one_step_requeue_oldest_first() -> None:
    # Equal one-block prompts admitted together cross a block boundary in the same step with
    # three blocks free: the newest go back to the queue at once, the oldest of them in front.
    config = with_room_for(replace(M3, max_num_seqs=8), 11 * 16)
    workload = build_workload(15, 60, 8, replace(LOAD, range_ratio=1.0))
    assert not fits_whole(Engine(config), *workload.length_arrays, 8)
    planned = simulate_point(config, workload, plan=True)
    stepped = simulate_point(config, workload, plan=False)
    assert_same(planned, stepped)
    assert stepped.server_metrics["preemptions"] >= 3
