"""The agentic trace replay against the real simulated server over HTTP (agentic.md §2.3, §3).

The shipped 3-trace corpus's prompts carry its cache structure exactly: the server's prefix
cache finds, over every request sent, the theoretical hits the trace implies and no more (the
cache-bust marker keeps plays apart). With the server on its real clock, a stream's next turn
leaves no earlier than the recorded end-to-start gap after the previous one ended, a joining
root turn waits for its subagent, and either idle cap (system, per tree) shortens a long gap.
The in-process replay on the simulated engine (`sim/replay_driver.py`) follows the same schedule:
it sends what the HTTP replay sends, and on its virtual clock the rules hold exactly. A context
overflow ends its session both ways.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from shared_data import CORPUS
from trace_files import overflow_trace

from pytest_inferbench.backends.base import PointNotMeasuredError
from pytest_inferbench.backends.http import HttpServerHandle
from pytest_inferbench.backends.http_replay import run_replay_point
from pytest_inferbench.loadgen.client import CHAT_ENDPOINT, ClientConfig
from pytest_inferbench.loadgen.replay import ReplayConfig, ReplayedRequest, ReplayRun, replay
from pytest_inferbench.loadgen.replay_schedule import FROM_TURN_0
from pytest_inferbench.loadgen.synthetic_traces import (
    SyntheticTraceSettings,
    write_synthetic_traces,
)
from pytest_inferbench.loadgen.trace_sessions import sessions
from pytest_inferbench.loadgen.traces import load_traces
from pytest_inferbench.loadgen.workload import LoadSettings
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.engine import Engine, RequestRejectedError
from pytest_inferbench.sim.replay_driver import SimulatedReplay, simulate_replay
from pytest_inferbench.sim.server.launcher import launch

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from pytest_inferbench.loadgen.trace_sessions import SessionTree
    from pytest_inferbench.results.metrics import RequestRecord

MODEL = "amd/MiniMax-M3-MXFP4"
BLOCK = 16  # divides the traces' 64-token blocks: every trace block is whole engine blocks


def _serve(tmp_path: Path, traces: Path, conc: int, settings: ReplayConfig,
           time_scale: str, *extra: str,
           on_profile: Callable[[], Awaitable[None]] | None = None
           ) -> tuple[ReplayRun, dict[str, float]]:
    argv = ("vllm", "serve", MODEL, "--tensor-parallel-size", "4", "--block-size", str(BLOCK),
            *extra)
    server = launch(argv, ("--hardware", "MI355X", "--time-scale", time_scale),
                    log_dir=tmp_path)
    try:
        server.wait_healthy(timeout_s=60)
        trees = [sessions(t) for t in load_traces(traces)]
        cfg = ClientConfig(base_url=server.base_url, model=MODEL, endpoint=CHAT_ENDPOINT,
                           concurrency=conc)
        run = asyncio.run(replay(cfg, trees, conc, settings, on_profile=on_profile))
        metrics = httpx.get(server.base_url + "/metrics", timeout=30).text
    finally:
        server.stop()
    counters = {}
    for line in metrics.splitlines():  # `name{labels} value`: the two counters
        name = line.split("{")[0]
        if name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
            counters[name] = float(line.rsplit(" ", 1)[1])
    return run, counters


def _in_process(trees: Sequence[SessionTree], lanes: int, settings: ReplayConfig,
                *extra: str) -> SimulatedReplay:
    """The same replay on the simulated engine in process (`sim/replay_driver.py`)."""
    config, _ = engine_config_from_argv(
        ["vllm", "serve", MODEL, "--tensor-parallel-size", "4", "--block-size", str(BLOCK),
         *extra], hardware="MI355X")
    return simulate_replay(Engine(config, keep_traces=True), trees, lanes, settings, chat=True)


@pytest.mark.skipif(not CORPUS.exists(), reason="the shared agentic corpus is not here")
def test_corpus_prompts_hit_exactly_the_theoretical_blocks(tmp_path: Path) -> None:
    run, counters = _serve(tmp_path, CORPUS, 3,
                           ReplayConfig(**FROM_TURN_0, duration_s=1.0, delay_scale=0.0), "0")
    assert run.records and all(r.success for r in run.records)
    # Every trace was played through at least once, every stream turn by turn.
    assert {q.trace_id for q in run.requests} == {"syn-linear-001", "syn-subagent-002",
                                                  "syn-idle-003"}
    assert run.plays_completed >= 3
    # The server looked up every prompt token sent and found exactly the blocks the trace says
    # an earlier request of the same play sent: none of another lane's or play's.
    assert counters["vllm:prefix_cache_queries_total"] == sum(r.input_tokens for r in run.records)
    expected = sum(q.hit_blocks * q.block_size for q in run.requests)
    assert expected > 0
    assert counters["vllm:prefix_cache_hits_total"] == expected
    # max_tokens is the recorded output length, met under ignore_eos.
    assert [r.output_tokens for r in run.records] == [q.output_length for q in run.requests]


def test_the_profiling_phase_begins_after_on_profile_with_nothing_in_flight(
        tmp_path: Path) -> None:
    """`on_profile` (where the point's "before" scrape is taken) is awaited once the warmup
    drained: every warmup request has ended before it and every profiled one is sent after it
    returned, which is where the measured phase (and its duration) starts."""
    calls: list[tuple[float, float]] = []

    async def on_profile() -> None:
        entered = time.perf_counter()
        await asyncio.sleep(0.05)  # a scrape's round trip, on the client's event loop
        calls.append((entered, time.perf_counter()))

    traces = write_synthetic_traces(tmp_path / "t.jsonl", SyntheticTraceSettings(
        traces=2, turns=10, subagents=1))
    settings = ReplayConfig(duration_s=1.0, delay_scale=0.0, warmup_per_lane=2)
    run, _ = _serve(tmp_path, traces, 2, settings, "0", on_profile=on_profile)
    assert len(calls) == 1
    entered, returned = calls[0]
    warm = [r for r in run.records if r.warmup]
    profiled = [r for r in run.records if not r.warmup]
    assert warm and profiled
    assert max(r.end_time for r in warm) <= entered
    assert min(r.send_time for r in profiled) >= returned
    assert returned <= run.profile_start == run.end - run.duration_s


@pytest.mark.skipif(not CORPUS.exists(), reason="the shared agentic corpus is not here")
def test_the_in_process_replay_sends_what_the_http_replay_sends(tmp_path: Path) -> None:
    """One lane plays the trees turn by turn (a subagent between the turns that spawn and join
    it), so both replays finish their requests in one order: the same turns, the same
    prompt and output lengths, play after play."""
    # Long enough for three plays on a busy machine; the comparison is over what both sent.
    settings = ReplayConfig(**FROM_TURN_0, duration_s=5.0, delay_scale=0.0)
    run, _ = _serve(tmp_path, CORPUS, 1, settings, "0")
    trees = [sessions(t) for t in load_traces(CORPUS)]
    sim = _in_process(trees, 1, ReplayConfig(**FROM_TURN_0, duration_s=60.0, delay_scale=0.0))

    def sent(requests: Sequence[ReplayedRequest], records: Sequence[RequestRecord]
             ) -> list[tuple[object, ...]]:
        return [(q.play, q.session_id, q.turn, r.input_tokens, r.output_tokens, r.success)
                for q, r in zip(requests, records, strict=True)]

    over_http = sent(run.requests, run.records)
    in_process = sent(sim.requests, sim.records)
    n = min(len(over_http), len(in_process))
    assert n >= 9  # every trace played through at least once by both
    assert in_process[:n] == over_http[:n]


def test_nested_agents_replay_alike_in_process_and_over_http(tmp_path: Path) -> None:
    """Synthetic trees whose subagents hold nested agents two levels deep, one lane, with
    InferenceX's start (a seeded t*, primers, per-lane warmups): both replays send each
    stream the same turns in the same order, warmup flagged alike, a turn that joins nested
    agents sent only after they ended."""
    file = write_synthetic_traces(tmp_path / "nested.jsonl", SyntheticTraceSettings(
        traces=2, turns=4, subagents=1, subagent_turns=2, nested=2, seed=4))
    trees = [sessions(t) for t in load_traces(file)]
    assert any(":fa:" in link.parent for link in trees[0].links)  # a nested agent's child
    run, _ = _serve(tmp_path, file, 1, ReplayConfig(duration_s=3.0, delay_scale=0.0,
                                                    warmup_per_lane=2), "0")
    sim = _in_process(trees, 1, ReplayConfig(duration_s=60.0, delay_scale=0.0,
                                             warmup_per_lane=2))

    def sent(requests: Sequence[ReplayedRequest], records: Sequence[RequestRecord]
             ) -> list[tuple[object, ...]]:
        return [(q.play, q.session_id, q.turn, r.input_tokens, r.output_tokens, r.warmup)
                for q, r in zip(requests, records, strict=True)]

    over_http, in_process = sent(run.requests, run.records), sent(sim.requests, sim.records)

    def by_stream(rows: list[tuple[object, ...]], plays: range
                  ) -> dict[tuple[object, object], list[tuple[object, ...]]]:
        out: dict[tuple[object, object], list[tuple[object, ...]]] = {}
        for play, session, *turn in rows:
            if play in plays:
                out.setdefault((play, session), []).append(tuple(turn))
        return out

    # Streams in flight side by side (a tree's primers, sibling agents) may end in either
    # order over HTTP; what both replays must agree on is each stream's turns, in order.
    # Both played the first two trees through, warmup and nested agents and all.
    done = range(min(run.plays_completed, sim.plays_completed))
    assert len(done) >= 2
    assert by_stream(in_process, done) == by_stream(over_http, done)
    assert [w for *_, w in over_http[:3]] == [True] * 3 and not over_http[-1][-1]
    for out in (list(zip(run.requests, run.records, strict=True)),
                list(zip(sim.requests, sim.records, strict=True))):
        ends = {(q.play, q.session_id): r.end_time for q, r in out}
        tree = trees[1]
        for q, r in out:
            if q.play != 1:
                continue
            for link in tree.links:
                if tree.parent_of(link) == q.session_id and link.join_turn == q.turn:
                    assert r.send_time >= ends[(1, link.session_id)]




def test_a_context_overflow_ends_its_session_over_http(tmp_path: Path) -> None:
    """The server answers the third turn (2048 in) with HTTP 400 for its 1000-token context:
    that stream ends there in every play, its smaller fourth turn never sent."""
    run, _ = _serve(tmp_path, overflow_trace(tmp_path), 1,
                    ReplayConfig(**FROM_TURN_0, duration_s=2.0, delay_scale=0.0), "0",
                    "--max-model-len", "1000")
    plays: dict[int, list[tuple[int, bool]]] = {}
    for q, r in zip(run.requests, run.records, strict=True):
        plays.setdefault(q.play, []).append((q.turn, r.success))
    assert len(plays) > 1 and run.plays_completed == 0
    assert plays[0] == [(0, True), (1, True), (2, False)]
    assert all(turns == plays[0][:len(turns)] for turns in plays.values())


def test_a_root_warmup_request_that_fails_aborts_the_replay(tmp_path: Path) -> None:
    """t* falls before the overflowing third turn, so the lane's warmup sends it: the server
    answers HTTP 400 on the root stream, and the replay stops before profiling (AIPerf exits
    non-zero), over HTTP and in process alike; the point is not measured."""
    settings = ReplayConfig(duration_s=30.0, trajectory_start=(0.25, 0.5))
    run, _ = _serve(tmp_path, overflow_trace(tmp_path), 1, settings, "0",
                    "--max-model-len", "1000")
    assert "warmup request of root stream overflow (lane 0, turn 2) failed" in run.aborted
    assert "maximum context length" in run.aborted  # the server's own words
    assert all(q.warmup for q in run.requests) and not run.cancelled
    assert [q.turn for q in run.requests][-1] == 2
    tree = sessions(load_traces(overflow_trace(tmp_path))[0])
    with pytest.raises(RequestRejectedError, match="warmup request of root stream overflow"):
        _in_process([tree], 1, settings, "--max-model-len", "1000")


def test_an_aborted_replay_leaves_its_point_not_measured(tmp_path: Path) -> None:
    """Through the HTTP backend's point runner: the point fails with the abort's cause."""
    from test_server_metrics import vllm_point

    spec, config = vllm_point("agentic-coding")
    point = dataclasses.replace(config.points()[0], conc=1)
    server = launch(("vllm", "serve", MODEL, "--tensor-parallel-size", "4", "--max-model-len",
                     "1000"), ("--hardware", "MI355X", "--time-scale", "0"), log_dir=tmp_path)
    try:
        server.wait_healthy(timeout_s=60)
        handle = HttpServerHandle(base_url=server.base_url, spec=spec, simulated=True,
                                  time_scale=0.0)
        load = LoadSettings(replay_duration_s=30.0, traces=overflow_trace(tmp_path),
                            trajectory_start=(0.25, 0.5))
        with pytest.raises(PointNotMeasuredError,
                           match=r"warmup request of root stream overflow .*failed"):
            run_replay_point(handle, point, load)
    finally:
        server.stop()


def _trace_file(tmp_path: Path) -> Path:
    """A root of three turns with gaps of 0.4 s and 6 s, and a subagent spawned by turn 0 and
    joined by turn 2 (it ends at 0.7 s, after turn 1 started; its own turns 0.3 s apart)."""
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


@pytest.mark.parametrize(("system_cap", "trace_cap"), [(1.0, 300.0), (100.0, 1.0)],
                         ids=["system-cap", "trace-cap"])
def test_gaps_joins_and_the_idle_caps_at_time_scale_1(tmp_path: Path, system_cap: float,
                                                      trace_cap: float) -> None:
    cap = min(system_cap, trace_cap)
    run, _ = _serve(tmp_path, _trace_file(tmp_path), 1,
                    ReplayConfig(**FROM_TURN_0, duration_s=3.0, system_idle_cap_s=system_cap,
                                 trace_idle_cap_s=trace_cap), "1")
    assert all(r.success for r in run.records)
    by_turn = {(q.session_id, q.turn): (q, r) for q, r in zip(run.requests, run.records,
                                                             strict=True) if q.play == 0}
    assert len(by_turn) == 5 and run.plays_completed >= 1
    for (session, turn), (q, r) in by_turn.items():
        if q.previous_end is None:
            continue
        assert q.delay_s is not None
        # Never earlier than the recorded gap (capped at the system cap) after the end.
        assert r.send_time - q.previous_end >= min(q.delay_s, cap) - 1e-3, (session, turn)
    root2_sent = by_turn[("gaps", 2)][1].send_time
    sub_last = by_turn[("gaps::sa:sa1", 1)][1]
    assert root2_sent >= sub_last.end_time  # the join waits for the subagent
    sub0 = by_turn[("gaps::sa:sa1", 0)][1]
    assert sub0.send_time >= by_turn[("gaps", 0)][1].end_time  # spawned by root turn 0
    # The 6 s gap (nothing in flight in the tree, nor anywhere) is shortened by the cap.
    gap = by_turn[("gaps", 2)][1].send_time - by_turn[("gaps", 1)][1].end_time
    assert cap - 1e-3 <= gap < 6.0


@pytest.mark.parametrize(("system_cap", "trace_cap"),
                         [(1.0, 300.0), (100.0, 1.0), (100.0, 300.0)],
                         ids=["system-cap", "trace-cap", "no-cap"])
def test_gaps_joins_and_idle_caps_hold_exactly_on_the_virtual_clock(
        tmp_path: Path, system_cap: float, trace_cap: float) -> None:
    trees = [sessions(t) for t in load_traces(_trace_file(tmp_path))]
    out = _in_process(trees, 1, ReplayConfig(**FROM_TURN_0, duration_s=30.0,
                                             system_idle_cap_s=system_cap,
                                             trace_idle_cap_s=trace_cap))
    by_turn = {(q.session_id, q.turn): r for q, r in zip(out.requests, out.records, strict=True)
               if q.play == 0}
    assert len(by_turn) == 5 and out.plays_completed >= 1
    root0, root1, root2 = (by_turn[("gaps", k)] for k in range(3))
    sub0, sub1 = (by_turn[("gaps::sa:sa1", k)] for k in range(2))
    assert sub0.send_time == root0.end_time  # spawned by root turn 0, at offset 0
    recorded = {("gaps::sa:sa1", 1): 0.3, ("gaps", 1): 0.4}
    assert sub1.send_time == pytest.approx(sub0.end_time + recorded[("gaps::sa:sa1", 1)])
    assert root1.send_time == pytest.approx(root0.end_time + recorded[("gaps", 1)])
    # The 6 s gap, with nothing in flight anywhere, is shortened to the cap; turn 2 joins the
    # subagent, long done by then.
    assert root2.send_time - root1.end_time == pytest.approx(min(6.0, system_cap, trace_cap))
    assert root2.send_time > sub1.end_time
    # The lane recycles the drained tree at once, under a new play.
    next_play = [r for q, r in zip(out.requests, out.records, strict=True) if q.play == 1]
    assert next_play and next_play[0].send_time == root2.end_time


def test_a_joining_turn_waits_for_a_long_subagent_in_process(tmp_path: Path) -> None:
    """The subagent decodes 1500 tokens; the root turn that joins it is due 0.05 s after the
    turn before (recorded as a minute long, replayed in a blink), long before the subagent
    ends: it is sent when the subagent completes."""
    def req(t: float, out: int, api: float = 0.1) -> dict[str, object]:
        return {"t": t, "type": "n", "model": "x", "in": 128, "out": out, "hash_ids": [0, 1],
                "api_time": api}
    trace = {"id": "join", "models": ["x"], "block_size": 64, "hash_id_scope": "local",
             "requests": [req(0.0, 4),
                          {"t": 0.1, "type": "subagent", "agent_id": "long",
                           "subagent_type": "Subagent", "status": "completed", "models": ["x"],
                           "duration_ms": 60_000, "requests": [req(0.1, 1500)]},
                          req(0.2, 4, api=59.95), req(60.2, 4)]}
    path = tmp_path / "join.jsonl"
    path.write_text(json.dumps(trace) + "\n", encoding="utf-8")
    tree = sessions(load_traces(path)[0])
    assert [(link.spawn_turn, link.join_turn) for link in tree.links] == [(0, 2)]
    out = _in_process([tree], 1, ReplayConfig(**FROM_TURN_0, duration_s=120.0))
    by_turn = {(q.session_id, q.turn): r for q, r in zip(out.requests, out.records, strict=True)
               if q.play == 0}
    root0, root1, root2 = (by_turn[("join", k)] for k in range(3))
    sub = by_turn[("join::sa:long", 0)]
    assert sub.send_time == root0.end_time
    assert root1.send_time == pytest.approx(root0.end_time + 0.1)  # turn 1 joins nothing
    assert root1.end_time + 0.05 < sub.end_time
    assert root2.send_time == sub.end_time  # released by the subagent's end, not its timer


def test_a_context_overflow_ends_its_session_in_process(tmp_path: Path) -> None:
    # Played after four plays of another tree, the one failure stays under a tenth of all.
    gaps = sessions(load_traces(_trace_file(tmp_path))[0])
    overflow = sessions(load_traces(overflow_trace(tmp_path))[0])
    out = _in_process([gaps] * 4 + [overflow], 1, ReplayConfig(**FROM_TURN_0, duration_s=200.0),
                  "--max-model-len", "1000")
    sent = [(q, r) for q, r in zip(out.requests, out.records, strict=True)
            if q.trace_id == "overflow" and q.play == 4]
    assert [q.turn for q, _ in sent] == [0, 1, 2]  # the fourth turn is never sent
    assert [r.success for _, r in sent] == [True, True, False]
    assert "maximum context length" in sent[2][1].error
    assert sent[2][1].send_time == sent[2][1].end_time  # answered at once
    assert out.plays > 5 and out.plays_completed < out.plays  # the lane went on
