"""The agentic trace replay in process (`sim/replay_driver.py`): the HTTP replay's schedule on
the engine's virtual clock.

The engine is fed block keys, not prompt text: they must be equal exactly where the simulated
server's content hashes of the prompts the HTTP replay sends are, so the prefix cache finds the
trace's theoretical hits and no more. Nothing is sent after the duration; a replay most of whose
requests fail stops. (`tests/loadgen/test_replay.py` plays the same traces both ways.)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from shared_data import CORPUS

from pytest_inferbench.loadgen import replay_prompts
from pytest_inferbench.loadgen.replay_prompts import (
    BlockText,
    PromptKeys,
    marker,
    prompt_block_keys,
    prompt_text,
    prompt_tokens,
)
from pytest_inferbench.loadgen.replay_schedule import FROM_TURN_0, ReplayConfig
from pytest_inferbench.loadgen.tokenizer import render_chat
from pytest_inferbench.loadgen.trace_sessions import SessionTree, Turn, sessions
from pytest_inferbench.loadgen.traces import TraceRequest, load_traces
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.engine import Engine, RequestRejectedError
from pytest_inferbench.sim.prefix_cache import block_hashes
from pytest_inferbench.sim.replay_driver import SimulatedReplay, simulate_replay

if TYPE_CHECKING:
    from collections.abc import Sequence

MODEL = "amd/MiniMax-M3-MXFP4"
needs_corpus = pytest.mark.skipif(not CORPUS.exists(),
                                  reason="the shared agentic corpus is not here")


def _trees(path: Path) -> list[SessionTree]:
    return [sessions(t) for t in load_traces(path)]


def _replay(trees: Sequence[SessionTree], lanes: int, settings: ReplayConfig, *,
            block: int = 16, chat: bool = True, extra: Sequence[str] = ()) -> SimulatedReplay:
    config, _ = engine_config_from_argv(
        ["vllm", "serve", MODEL, "--tensor-parallel-size", "4", "--block-size", str(block),
         *extra], hardware="MI355X")
    return simulate_replay(Engine(config, keep_traces=True), trees, lanes, settings, chat=chat)


@needs_corpus
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("block", [1, 16, 48, 64])
@pytest.mark.parametrize("vector_blocks", [0, 10**9], ids=["arrays", "integers"])
def test_block_keys_are_equal_where_the_servers_hashes_of_the_sent_prompts_are(
        chat: bool, block: int, vector_blocks: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Both ways of mixing the keys (numpy arrays for many blocks, Python integers for few)
    # are held to the server's hashes, whatever the prompt's block count.
    monkeypatch.setattr(replay_prompts, "VECTOR_BLOCKS", vector_blocks)
    server_to_key: dict[int, int] = {}
    key_to_server: dict[int, int] = {}
    blocks = 0
    for play, tree in enumerate(_trees(CORPUS) * 2):  # each trace in two plays
        text = BlockText(tree.trace.id, tree.trace.block_size)
        rid = marker("run", play, 0, tree.trace.id)
        for turns in tree.streams.values():
            for turn in turns:
                sent = prompt_text(text.stream(turn), rid, chat=chat)
                tokens = (render_chat([("user", sent)]) if chat else sent).split()
                assert len(tokens) == prompt_tokens(turn.request.input_length, chat=chat)
                hashes = block_hashes(tokens, block)
                keys = prompt_block_keys(turn, tree.trace.block_size, play, block, chat=chat)
                assert len(keys) == len(hashes)
                for h, k in zip(hashes, keys, strict=True):
                    assert server_to_key.setdefault(h, k) == k
                    assert key_to_server.setdefault(k, h) == h
                blocks += len(hashes)
    assert len(server_to_key) < blocks  # blocks are shared: the equalities were put to test


@needs_corpus
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("block", [1, 16, 48, 64])
def test_a_streams_turns_reuse_their_previous_turns_keys_and_get_the_same_keys(
        chat: bool, block: int) -> None:
    keys = PromptKeys(block, chat=chat)
    for play, tree in enumerate(_trees(CORPUS) * 2):  # each trace in two plays
        for turns in tree.streams.values():
            for turn in turns:
                assert keys(turn, tree.trace.block_size, play, last=turn is turns[-1]) == \
                    prompt_block_keys(turn, tree.trace.block_size, play, block, chat=chat)
    assert keys.reused > 0  # the reuse was put to the test
    assert not keys._last  # every stream's prompt was dropped at its last turn


@pytest.mark.parametrize("block", [1, 16, 64])
def test_a_turn_that_does_not_extend_its_streams_previous_prompt_gets_its_own_keys(
        block: int) -> None:
    # A later turn whose trace blocks part from the previous turn's (a compacted context)
    # shares the keys of the blocks before they part, and only those.
    def turn(index: int, hash_ids: tuple[int, ...], words: int) -> Turn:
        return Turn("s", index, TraceRequest(t=0.0, streaming=True, model="m",
                                             input_length=words, output_length=1,
                                             hash_ids=hash_ids),
                    delay=None, hit_blocks=0, total_blocks=0)
    first = turn(0, tuple(range(20)), 20 * 64)
    later = turn(1, (*range(7), 99, *range(8, 30)), 30 * 64 + 10)
    keys = PromptKeys(block, chat=True)
    got = [keys(t, 64, 3, last=False) for t in (first, later)]
    assert got == [prompt_block_keys(t, 64, 3, block, chat=True) for t in (first, later)]
    assert got[0][:7 * 64 // block] == got[1][:7 * 64 // block]
    assert got[0][7 * 64 // block] != got[1][7 * 64 // block]


@needs_corpus
def test_in_process_prefix_hits_are_the_theoretical_hits() -> None:
    out = _replay(_trees(CORPUS), 3, ReplayConfig(**FROM_TURN_0, duration_s=300.0))
    assert out.records and all(r.success for r in out.records)
    assert {q.trace_id for q in out.requests} == {"syn-linear-001", "syn-subagent-002",
                                                  "syn-idle-003"}
    assert out.plays_completed >= 3
    metrics = out.server_metrics
    assert metrics["prefix_cache_queries"] == sum(r.input_tokens for r in out.records)
    expected = sum(q.hit_blocks * q.block_size for q in out.requests)
    assert expected > 0
    assert metrics["prefix_cache_hits"] == expected
    assert [r.output_tokens for r in out.records] == [q.output_length for q in out.requests]


@needs_corpus
def test_nothing_is_sent_after_the_duration_and_what_is_in_flight_counts() -> None:
    out = _replay(_trees(CORPUS), 2, ReplayConfig(**FROM_TURN_0, duration_s=20.0))
    sends = [r.send_time for r in out.records]
    assert sends and max(sends) < 20.0
    assert out.duration_s >= max(r.end_time for r in out.records)
    assert len({q.play for q in out.requests}) == out.plays


@needs_corpus
def test_a_replay_whose_requests_mostly_fail_stops_saying_why() -> None:
    # Every third request of the linear trace fails: past AIPerf's 10 % threshold.
    with pytest.raises(RequestRejectedError, match=r"1 of the first 3 requests .*maximum "
                       "context length"):
        _replay(_trees(CORPUS)[:1], 1, ReplayConfig(**FROM_TURN_0, duration_s=30.0),
                extra=("--max-model-len", "1200"))


@needs_corpus
def test_the_measured_phase_counts_the_profiled_requests_and_not_the_warmup() -> None:
    # The power of a replayed point is priced from this window (`backends/sim.py`).
    config, _ = engine_config_from_argv(
        ["vllm", "serve", MODEL, "--tensor-parallel-size", "4"], hardware="MI355X")
    engine = Engine(config, keep_traces=True)
    out = simulate_replay(engine, _trees(CORPUS), 2, ReplayConfig(duration_s=60.0), chat=True)
    warmup = [r for r in out.records if r.warmup]
    measured = [r for r in out.records if not r.warmup]
    assert warmup and measured and out.profile_start > 0
    after = engine.counters()
    assert after.prompt_tokens - out.profile_counters.prompt_tokens == sum(
        r.input_tokens for r in measured)
    assert after.generation_tokens - out.profile_counters.generation_tokens == sum(
        r.output_tokens for r in measured)
    # The warmup ran steps too, before the window: the whole replay's count is larger.
    assert out.server_metrics["prompt_tokens"] > sum(r.input_tokens for r in measured)
    # Steps ran in the window, never longer than it.
    assert 0 < out.profile_busy_s <= out.duration_s - out.profile_start
