"""Engine mechanics: FCFS, batch bounds, chunked prefill, KV blocks and preemption, counters,
determinism, and the fast multi-step path agreeing exactly with step-by-step execution."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from pytest_inferbench.sim import catalog
from pytest_inferbench.sim.config import EngineConfig, SpecConfig
from pytest_inferbench.sim.engine import Engine, RequestRejectedError
from pytest_inferbench.sim.physics import ACTIVATION_BUFFERS, EngineConfigError, shard_model
from pytest_inferbench.sim.stretch import _window_sums, advance, plan

BASE = EngineConfig(hardware="MI355X", model="amd/MiniMax-M3-MXFP4", framework="atom", tp=4,
                    max_num_seqs=64, max_num_batched_tokens=8192, block_size=16,
                    gpu_memory_utilization=0.8, kv_cache_dtype="fp8")
EAGLE = SpecConfig(method="eagle3", draft_model="Inferact/MiniMax-M3-EAGLE3",
                   num_speculative_tokens=3)


def with_kv_tokens(config: EngineConfig, tokens: int) -> EngineConfig:
    """The same config with gpu_memory_utilization set so the KV cache holds ~`tokens`."""
    hw = catalog.hardware(config.hardware)
    models = [shard_model(catalog.checkpoint(config.model), hw, tp=config.tp, dp_attn=False,
                          kv_dtype=config.kv_cache_dtype, online_quant=None)]
    if config.spec:
        models.append(shard_model(catalog.checkpoint(str(config.spec.draft_model)), hw,
                                  tp=config.tp, dp_attn=False, kv_dtype=config.kv_cache_dtype,
                                  online_quant=None))
    fixed = sum(m.resident_bytes for m in models) + (
        ACTIVATION_BUFFERS * 2.0 * models[0].hidden * config.max_num_batched_tokens)
    per_token = sum(m.kv_store_per_token for m in models)
    return replace(config, gpu_memory_utilization=(fixed + (tokens + 0.5) * per_token)
                   / hw.hbm_bytes)


def closed_loop(engine: Engine, lengths: list[tuple[int, int]], conc: int, *,
                fast: bool) -> tuple[float, dict[int, tuple[list[int], list[int]]]]:
    """Drive the engine like a closed-loop client; returns total time and each trace."""
    pending = list(range(len(lengths)))[::-1]
    for _ in range(min(conc, len(lengths))):
        i = pending.pop()
        engine.add_request(i, *lengths[i])
    total = 0.0
    steps_seen = engine.steps_done
    traces: dict[int, tuple[list[int], list[int]]] = {}
    while engine.has_work():
        if fast:
            batch = advance(engine, 1 << 20)
            total += float(batch.durations.sum())
            steps_seen += len(batch.durations)
            finished = batch.finished
        else:
            result = engine.step()
            total += result.duration_s
            steps_seen += 1
            finished = result.finished
        for rid in finished:
            trace = engine.pop_trace(rid)
            traces[rid] = (trace.steps.tolist(), trace.tokens.tolist())
            if pending:
                i = pending.pop()
                engine.add_request(i, *lengths[i])
    assert steps_seen == engine.steps_done  # one duration per step: traces index a timeline
    return total, traces


def lengths_for(n: int, isl: int, osl: int, seed: int = 1) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    return [(int(a), int(b)) for a, b in zip(rng.integers(isl // 2, isl + 1, n),
                                             rng.integers(osl // 2, osl + 1, n), strict=True)]


@pytest.mark.parametrize("spec", [None, EAGLE], ids=["plain", "eagle3"])
def test_fast_path_equals_step_by_step(spec: SpecConfig | None) -> None:
    config = with_kv_tokens(replace(BASE, spec=spec, max_num_seqs=8), 12_000)
    work = lengths_for(24, 2000, 300)
    t_slow, slow = closed_loop(Engine(config, keep_traces=True), work, 8, fast=False)
    fast_engine = Engine(config, keep_traces=True)
    t_fast, fast = closed_loop(fast_engine, work, 8, fast=True)
    assert fast == slow
    assert t_fast == pytest.approx(t_slow, rel=1e-9)
    assert fast_engine.counters().preemptions > 0  # the small cache made it preempt


@pytest.mark.parametrize("spec", [None, EAGLE], ids=["plain", "eagle3"])
@pytest.mark.parametrize("kv_tokens", [None, 6_000], ids=["roomy-cache", "small-cache"])
def test_fast_path_equals_step_by_step_when_decoders_outnumber_the_token_budget(
        spec: SpecConfig | None, kv_tokens: int | None) -> None:
    # 16 plain decoders or 16 drafting ones (4 tokens each) per step, of the 24 running.
    config = replace(BASE, spec=spec, max_num_seqs=32,
                     max_num_batched_tokens=64 if spec else 16)
    config = with_kv_tokens(config, kv_tokens) if kv_tokens else config
    work = lengths_for(60, 400, 300, seed=5)
    conc = 24
    t_slow, slow = closed_loop(Engine(config, keep_traces=True), work, conc, fast=False)
    t_fast, fast = closed_loop(Engine(config, keep_traces=True), work, conc, fast=True)
    assert fast == slow
    assert t_fast == pytest.approx(t_slow, rel=1e-9)


def test_a_batch_wider_than_the_token_budget_is_a_stretch_of_its_first_decoders() -> None:
    engine = Engine(replace(BASE, max_num_seqs=32, max_num_batched_tokens=16),
                    keep_traces=True)
    for rid in range(24):
        engine.add_request(rid, 8, 50)
    while engine.waiting or not engine.slots.decoding[engine.run_array()].all():
        engine.step()
    stretch = plan(engine, 1 << 20)
    assert stretch is not None and stretch.n > 1
    assert stretch.idx.tolist() == engine.run_array()[:16].tolist()  # admission order
    engine.add_request(99, 8, 50)  # a waiting request the leftover budget could admit
    assert plan(engine, 1 << 20) is None


def test_fcfs_and_max_num_seqs() -> None:
    engine = Engine(replace(BASE, max_num_seqs=2), keep_traces=True)
    for rid in range(4):
        engine.add_request(rid, 100, 5)
    engine.step()
    c = engine.counters()
    assert (c.num_requests_running, c.num_requests_waiting) == (2, 2)
    order: list[int] = []
    while engine.has_work():
        order += engine.step().finished
        assert engine.counters().num_requests_running <= 2
    assert order == [0, 1, 2, 3]


def test_chunked_prefill_spends_the_token_budget_decode_first() -> None:
    engine = Engine(replace(BASE, max_num_batched_tokens=4096), keep_traces=True)
    engine.add_request(0, 50, 100)
    first = engine.step()
    assert first.emitted == [(0, 1)]  # prefill done in one step: the first token
    engine.add_request(1, 10_000, 10)
    emitted_by_1 = []
    for _ in range(3):
        step = engine.step()
        assert (0, 1) in step.emitted  # the decoding request is never starved
        emitted_by_1 += [n for rid, n in step.emitted if rid == 1]
    # 10000 prompt tokens with 4095 budget left per step: chunks 4095, 4095, 1810 -> token.
    assert emitted_by_1 == [1]


def test_preemption_recomputes_and_every_request_still_gets_its_tokens() -> None:
    config = with_kv_tokens(BASE, 6_000)
    engine = Engine(config, keep_traces=True)
    work = [(1500, 800)] * 6
    _, traces = closed_loop(engine, work, 6, fast=True)
    c = engine.counters()
    assert c.preemptions > 0
    for rid, (steps, tokens) in traces.items():
        assert sum(tokens) == work[rid][1]
        assert all(b > a for a, b in itertools.pairwise(steps))
    assert c.generation_tokens == sum(o for _, o in work)
    assert c.prompt_tokens == sum(i for i, _ in work)  # counted once, not per recompute
    assert c.kv_blocks_used == 0 and c.peak_kv_cache_usage > 0.9


def test_spec_decode_counters_are_consistent_and_exact() -> None:
    engine = Engine(replace(BASE, spec=replace(EAGLE, acceptance_length=2.5)), keep_traces=True)
    work = lengths_for(16, 1000, 400)
    _, traces = closed_loop(engine, work, 8, fast=True)
    c = engine.counters()
    decode_steps = sum(len(steps) - 1 for steps, _ in traces.values())
    assert c.spec_num_drafts == decode_steps  # one draft per decoding sequence per step
    assert c.spec_num_draft_tokens == 3 * decode_steps
    assert sum(c.spec_accepted_histogram) == decode_steps
    assert c.spec_num_accepted_tokens == sum(
        a * n for a, n in enumerate(c.spec_accepted_histogram))
    assert sum(c.spec_accepted_per_pos) == c.spec_num_accepted_tokens
    # Minimum-variance schedule for AL 2.5: every step accepts 1 or 2 drafts.
    assert c.spec_accepted_histogram[0] == c.spec_accepted_histogram[3] == 0
    assert c.acceptance_length == pytest.approx(2.5, rel=0.02)
    assert c.generation_tokens == sum(o for _, o in work)


def test_same_seed_same_result_and_jitter_is_seeded() -> None:
    work = lengths_for(12, 800, 200)
    runs = [closed_loop(Engine(replace(BASE, spec=EAGLE, jitter=j, seed=s), keep_traces=True),
                        work, 4, fast=True) for j, s in ((0.05, 7), (0.05, 7), (0.05, 8),
                                                         (0.0, 7), (0.0, 8))]
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[2][0]
    assert runs[3][0] != runs[0][0]
    assert runs[3][0] == pytest.approx(closed_loop(
        Engine(replace(BASE, spec=EAGLE, seed=7), keep_traces=True), work, 4, fast=False)[0])


def test_requests_longer_than_the_context_are_rejected() -> None:
    engine = Engine(replace(BASE, max_model_len=4096))
    with pytest.raises(RequestRejectedError, match="maximum context length is 4096"):
        engine.add_request(0, 4000, 200)
    assert not engine.has_work()


def test_abort_frees_the_slot_and_blocks() -> None:
    engine = Engine(BASE)
    engine.add_request(0, 3000, 100)
    engine.add_request(1, 3000, 100)
    engine.step()
    assert engine.counters().kv_blocks_used > 0
    engine.abort_request(0)
    engine.abort_request(1)
    engine.abort_request(99)  # unknown ids are ignored
    c = engine.counters()
    assert (c.kv_blocks_used, c.num_requests_running, engine.has_work()) == (0, 0, False)


def test_long_chunked_prompts_under_kv_pressure_all_complete() -> None:
    # Prompts four times the token budget, a cache that holds about two of them at once.
    config = with_kv_tokens(replace(BASE, max_num_batched_tokens=2048, max_num_seqs=8), 17_000)
    engine = Engine(config, keep_traces=True)
    work = [(8000, 50)] * 6
    _, traces = closed_loop(engine, work, 6, fast=True)
    assert sorted(traces) == list(range(6))
    assert all(sum(tokens) == 50 for _, tokens in traces.values())
    assert engine.counters().kv_blocks_used == 0
    # The cache ran full; a prompt whose next chunk's blocks were not free waited for them.
    assert engine.counters().peak_kv_cache_usage > 0.9


def test_a_request_bigger_than_the_whole_cache_is_rejected() -> None:
    engine = Engine(with_kv_tokens(BASE, 5_000))
    with pytest.raises(RequestRejectedError, match="exceeds the KV cache"):
        engine.add_request(0, 4_900, 200)


def test_draft_model_must_fit_the_target() -> None:
    m25 = replace(BASE, model="MiniMaxAI/MiniMax-M2.5",
                  spec=replace(EAGLE, acceptance_length=2.0))
    with pytest.raises(EngineConfigError, match="drafts for MiniMax-M3, not for"):
        Engine(m25)
    # No draft named: the catalog's draft for the target architecture.
    assert Engine(replace(BASE, spec=replace(EAGLE, draft_model=None))).cost.draft is not None


class GreedyPreemptingEngine(Engine):
    """The decode scheduling of vLLM's scheduler written out slot by slot: decoders in
    admission order; while one does not fit, preempt the newest running request (itself when
    it is the newest). The engine computes the same outcome in one vectorized pass."""

    def _schedule_decode(self) -> tuple[np.ndarray, int]:
        st, q = self.slots, self.k + 1
        budget = self.config.max_num_batched_tokens
        run = self.run_array()
        decode: list[int] = []
        for slot in run[st.decoding[run]].tolist():
            if st.rid[slot] < 0 or budget < q:
                continue
            need = max(-(-(int(st.ctx[slot]) + q) // self.block_size) - int(st.blocks[slot]), 0)
            while need > self.free_blocks and self.running[-1] != slot:
                self._preempt(self.running[-1])
            if need > self.free_blocks:
                self._preempt(slot)
                continue
            self.free_blocks -= need
            st.blocks[slot] += need
            decode.append(slot)
            budget -= q
        return np.asarray(decode, dtype=np.int64), budget


@pytest.mark.parametrize("spec", [None, EAGLE], ids=["plain", "eagle3"])
@pytest.mark.parametrize(("block_size", "decoders"), [(16, None), (1, None), (16, 12)],
                         ids=["blocks-of-16", "blocks-of-1", "decoders-beyond-the-budget"])
def test_preemption_under_kv_pressure_equals_the_slot_by_slot_scheduler(
        spec: SpecConfig | None, block_size: int, decoders: int | None) -> None:
    # `decoders`: a token budget that holds that many decoders and 400 prompt tokens a step.
    q = 1 + (spec.num_speculative_tokens if spec else 0)
    budget = 8192 if decoders is None else decoders * q + 400
    config = with_kv_tokens(replace(BASE, spec=spec, max_num_seqs=24, block_size=block_size,
                                    max_num_batched_tokens=budget), 9_000)
    work = lengths_for(60, 1200, 400, seed=3)
    greedy = GreedyPreemptingEngine(config, keep_traces=True)
    t_ref, ref = closed_loop(greedy, work, 20, fast=False)
    engine = Engine(config, keep_traces=True)
    t_new, new = closed_loop(engine, work, 20, fast=False)
    assert new == ref
    assert t_new == t_ref
    assert engine.counters() == greedy.counters()
    assert engine.counters().preemptions > 10


def test_several_preempted_in_one_step_queue_up_oldest_first() -> None:
    # Eight one-block prompts admitted together cross their first block boundary in the same
    # step, with 3 blocks free: the newest go back to the queue, the oldest of them in front.
    config = with_kv_tokens(replace(BASE, max_num_seqs=8, block_size=16), 11 * 16)
    engine = Engine(config, keep_traces=True)
    for rid in range(8):
        engine.add_request(rid, 15, 60)
    most = 0
    while not engine.counters().preemptions:
        engine.step()
        most = max(most, engine.counters().preemptions)
    assert most == 3 and list(engine.waiting) == [5, 6, 7]
    work = [(15, 60)] * 8
    assert (closed_loop(Engine(config, keep_traces=True), work, 8, fast=False)
            == closed_loop(GreedyPreemptingEngine(config, keep_traces=True), work, 8, fast=False))


def test_window_sums_of_a_one_token_stretch_are_the_matrix_sums() -> None:
    # A stretch without drafts sums min(c + s, window) per step from the sorted contexts;
    # the (sequences x steps) matrix it replaces gives the same integers.
    rng = np.random.default_rng(5)
    for window in (1, 128, 4096):
        ctx0 = rng.integers(1, 6000, size=int(rng.integers(1, 300))).astype(np.int64)
        n = int(rng.integers(1, 500))
        matrix = np.minimum(ctx0[:, None] + np.arange(n)[None, :], window).sum(axis=0)
        np.testing.assert_array_equal(_window_sums(ctx0, n, window), matrix.astype(np.float64))


@pytest.mark.parametrize("config", [
    BASE,
    replace(BASE, spec=SpecConfig(method="eagle3", draft_model="Inferact/MiniMax-M3-EAGLE3",
                                  num_speculative_tokens=3)),
    EngineConfig(hardware="H200", model="openai/gpt-oss-120b", framework="vllm", tp=1),
    EngineConfig(hardware="B200", model="deepseek-ai/DeepSeek-R1-0528", framework="sglang",
                 tp=8, ep=8, dp_attn=True),
], ids=["moe", "eagle3", "sliding-window", "mla-dp-attention"])
def test_a_stretch_priced_as_numbers_or_as_arrays_gives_the_same_durations(
        config: EngineConfig) -> None:
    # A stretch's steps share their token counts: priced one step at a time as numbers or all
    # at once as arrays, every duration is the same to the last bit, so where a short stretch
    # is priced as numbers changes nothing.
    cost = Engine(config).cost
    rng = np.random.default_rng(11)
    for seqs in (1.0, 37.0, 512.0):
        ctx = np.sort(rng.integers(1, 4_000_000, size=40)).astype(np.float64)
        win = np.minimum(ctx, seqs * 128.0)
        as_arrays = np.asarray(cost.step(decode_seqs=seqs, decode_ctx=ctx, decode_ctx_win=win))
        one_by_one = [cost.step(decode_seqs=seqs, decode_ctx=c, decode_ctx_win=w)
                      for c, w in zip(ctx.tolist(), win.tolist(), strict=True)]
        np.testing.assert_array_equal(as_arrays, np.array(one_by_one))
        np.testing.assert_array_equal(cost.stretch(seqs, ctx[:5], win[:5]), as_arrays[:5])


@pytest.mark.parametrize("config", [BASE, replace(BASE, spec=EAGLE)], ids=["plain", "eagle3"])
def test_a_stretch_cut_by_the_next_arrival_has_the_durations_of_the_whole_one_cut(
        config: EngineConfig) -> None:
    # A stretch cut at a duration prices only the steps up to the cut: the same durations as
    # the whole stretch priced and cut after the step whose running total reaches it.
    engine = Engine(config)
    for i in range(8):
        engine.add_request(i, 100 + 50 * i, 400 + 30 * i)
    while (whole := plan(engine, 1 << 20)) is None:
        engine.step()
    sums = np.cumsum(whole.durations)
    assert whole.n > 20
    for limit in (sums[0] / 2, sums[0], (sums[0] + sums[1]) / 2, sums[2], sums[17], sums[-1],
                  2 * sums[-1]):
        cut = plan(engine, 1 << 20, float(limit))
        assert cut is not None
        np.testing.assert_array_equal(
            cut.durations, whole.durations[:int(np.searchsorted(sums, limit)) + 1])


def test_the_running_slots_array_follows_admissions_and_finishes() -> None:
    # The array of running slots is kept in step with the running set, not rebuilt.
    engine = Engine(BASE)
    lengths = [(200 + 37 * i, 5 + 3 * (i % 7)) for i in range(40)]
    for i, (prompt, out) in enumerate(lengths[:10]):
        engine.add_request(i, prompt, out)
    added = 10
    changes = 0
    while engine.has_work():
        before = list(engine.running)
        finished = engine.step().finished
        changes += before != engine.running
        np.testing.assert_array_equal(engine.run_array(), np.asarray(engine.running))
        for _ in finished:
            if added < len(lengths):
                engine.add_request(added, *lengths[added])
                added += 1
    assert added == len(lengths) and changes > len(lengths)
