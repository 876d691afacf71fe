"""The agentic trace replay in process (`sim/replay_driver.py`): the HTTP replay's schedule on
the engine's virtual clock.

The engine is fed block keys, not prompt text: they must be equal exactly where the simulated
server's content hashes of the prompts the HTTP replay sends are, so the prefix cache finds the
trace's theoretical hits and no more. On the virtual clock the schedule's rules hold exactly:
a joining root turn waits for its subagent, an idle cap shortens a long gap to the cap, nothing
is sent after the duration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_inferbench.loadgen.replay_prompts import (
    BlockText,
    marker,
    prompt_block_keys,
    prompt_text,
    prompt_tokens,
)
from pytest_inferbench.loadgen.replay_schedule import ReplayConfig
from pytest_inferbench.loadgen.tokenizer import render_chat
from pytest_inferbench.loadgen.trace_sessions import SessionTree, sessions
from pytest_inferbench.loadgen.traces import load_traces
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.engine import Engine, RequestRejectedError
from pytest_inferbench.sim.prefix_cache import block_hashes
from pytest_inferbench.sim.replay_driver import SimulatedReplay, simulate_replay

if TYPE_CHECKING:
    from collections.abc import Sequence

CORPUS = Path("/work/shared/data/agentic/traces.jsonl")
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
@pytest.mark.parametrize("block", [16, 48, 64])
def test_block_keys_are_equal_where_the_servers_hashes_of_the_sent_prompts_are(
        chat: bool, block: int) -> None:
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
def test_in_process_prefix_hits_are_the_theoretical_hits() -> None:
    out = _replay(_trees(CORPUS), 3, ReplayConfig(duration_s=300.0))
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


def _gaps_trace(tmp_path: Path) -> Path:
    """A root of three turns with gaps of 0.4 s and 6 s, and a subagent spawned by turn 0 and
    joined by turn 1 (its own turns 0.3 s apart), each turn 4 tokens out."""
    def req(t: float, blocks: Sequence[int], api: float) -> dict[str, object]:
        return {"t": t, "type": "n", "model": "x", "in": 64 * len(blocks), "out": 4,
                "hash_ids": list(blocks), "api_time": api}
    trace = {"id": "gaps", "models": ["x"], "block_size": 64, "hash_id_scope": "local",
             "requests": [
                 req(0.0, [0, 1], 0.1),
                 {"t": 0.2, "type": "subagent", "agent_id": "sa1", "subagent_type": "Subagent",
                  "status": "completed", "models": ["x"], "duration_ms": 500,
                  "requests": [req(0.2, [0, 5], 0.1), req(0.6, [0, 5, 6], 0.1)]},
                 req(0.5, [0, 1, 2], 0.1),
                 req(6.6, [0, 1, 2, 3], 0.1)]}
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(trace) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(("system_cap", "trace_cap"),
                         [(1.0, 300.0), (100.0, 1.0), (100.0, 300.0)],
                         ids=["system-cap", "trace-cap", "no-cap"])
def test_gaps_joins_and_idle_caps_hold_exactly_on_the_virtual_clock(
        tmp_path: Path, system_cap: float, trace_cap: float) -> None:
    trees = _trees(_gaps_trace(tmp_path))
    out = _replay(trees, 1, ReplayConfig(duration_s=30.0, system_idle_cap_s=system_cap,
                                         trace_idle_cap_s=trace_cap))
    by_turn = {(q.session_id, q.turn): r for q, r in zip(out.requests, out.records, strict=True)
               if q.play == 0}
    assert len(by_turn) == 5 and out.plays_completed >= 1
    root0, root1, root2 = (by_turn[("gaps", k)] for k in range(3))
    sub0, sub1 = (by_turn[("gaps::sa:sa1", k)] for k in range(2))
    assert sub0.send_time == root0.end_time  # spawned by root turn 0, at offset 0
    recorded = {("gaps::sa:sa1", 1): 0.3, ("gaps", 1): 0.4}
    assert sub1.send_time == pytest.approx(sub0.end_time + recorded[("gaps::sa:sa1", 1)])
    # The join: the recorded gap after root turn 0, but not before the subagent is done.
    assert root1.send_time == pytest.approx(max(root0.end_time + recorded[("gaps", 1)],
                                                sub1.end_time))
    # The 6 s gap, with nothing in flight anywhere, is shortened to the cap.
    assert root2.send_time - root1.end_time == pytest.approx(min(6.0, system_cap, trace_cap))
    # The lane recycles the drained tree at once, under a new play.
    next_play = [r for q, r in zip(out.requests, out.records, strict=True) if q.play == 1]
    assert next_play and next_play[0].send_time == root2.end_time


@needs_corpus
def test_nothing_is_sent_after_the_duration_and_what_is_in_flight_counts() -> None:
    out = _replay(_trees(CORPUS), 2, ReplayConfig(duration_s=20.0))
    sends = [r.send_time for r in out.records]
    assert sends and max(sends) < 20.0
    assert out.duration_s >= max(r.end_time for r in out.records)
    assert len({q.play for q in out.requests}) == out.plays


@needs_corpus
def test_a_request_too_long_for_the_engine_fails_and_its_stream_goes_on() -> None:
    # The linear trace's last turn (1024 in + 2 template + 256 out) exceeds a 1200-token
    # context; the others fit. Played after three others, it stays under a tenth of all.
    linear, subagent, _ = _trees(CORPUS)
    out = _replay([subagent, subagent, subagent, linear], 1, ReplayConfig(duration_s=200.0),
                  extra=("--max-model-len", "1200"))
    failed = [(q, r) for q, r in zip(out.requests, out.records, strict=True) if not r.success]
    assert failed and all((q.trace_id, q.turn) == ("syn-linear-001", 2) for q, _ in failed)
    assert "maximum context length" in failed[0][1].error
    assert failed[0][1].send_time == failed[0][1].end_time  # answered at once
    assert out.plays > 4  # the lane went on to the next play


@needs_corpus
def test_a_replay_whose_requests_mostly_fail_stops_saying_why() -> None:
    # Every third request of the linear trace fails: past AIPerf's 10 % threshold.
    with pytest.raises(RequestRejectedError, match=r"1 of the first 3 requests .*maximum "
                       "context length"):
        _replay(_trees(CORPUS)[:1], 1, ReplayConfig(duration_s=30.0),
                extra=("--max-model-len", "1200"))
