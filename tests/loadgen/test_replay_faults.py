"""The agentic replay against a server that stops serving mid-replay (the real simulated server
over HTTP): a stream that goes silent with its socket open, a server stopped (SIGSTOP) and one
killed (SIGKILL). Each stops the replay at once, long before its duration, with the request,
its lane and the cause named; the other lanes' requests in flight are cancelled and nothing
of the replay is left running.

Bounds are generous (a busy shared machine): the replay's duration is a minute, a stopped
replay ends within half of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import TYPE_CHECKING

import httpx

from pytest_inferbench.loadgen.client import CHAT_ENDPOINT, ClientConfig, Timeouts
from pytest_inferbench.loadgen.replay import ReplayConfig, ReplayRun, replay
from pytest_inferbench.loadgen.trace_sessions import sessions
from pytest_inferbench.loadgen.traces import load_traces
from pytest_inferbench.sim.server.launcher import launch

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from pytest_inferbench.results.metrics import RequestRecord
    from pytest_inferbench.sim.server.launcher import SimServer

MODEL = "amd/MiniMax-M3-MXFP4"
ARGV = ("vllm", "serve", MODEL, "--tensor-parallel-size", "4")
STALL_S = 3.0
DURATION_S = 60.0  # what an unstopped replay would run for
BOUND_S = DURATION_S / 2


def _traces(tmp_path: Path, *streams: Sequence[tuple[float, int]]) -> Path:
    """One trace per stream of (end-to-start gap before the turn, output tokens) turns."""
    lines = []
    for n, turns in enumerate(streams):
        requests, t = [], 0.0
        for k, (gap, out) in enumerate(turns):
            t += gap
            requests.append({"t": t, "type": "n", "model": "x", "in": 64 * (k + 1), "out": out,
                             "hash_ids": list(range(k + 1)), "api_time": 0.1})
            t += 0.1
        lines.append(json.dumps({"id": f"trace{n}", "models": ["x"], "block_size": 64,
                                 "hash_id_scope": "local", "requests": requests}))
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _replay(server: SimServer, traces: Path, lanes: int,
            on_record: Callable[[RequestRecord], None] | None = None
            ) -> tuple[ReplayRun, list[str]]:
    """The replay, and what of it still ran when it returned (tasks of its event loop)."""
    trees = [sessions(t) for t in load_traces(traces)]
    cfg = ClientConfig(base_url=server.base_url, model=MODEL, endpoint=CHAT_ENDPOINT,
                       concurrency=lanes, timeouts=Timeouts(connect_s=5.0, read_s=STALL_S))

    async def main() -> tuple[ReplayRun, list[str]]:
        # Every lane from its first tree's first turn, no warmup: each request is known.
        settings = ReplayConfig(duration_s=DURATION_S, trajectory_start=(0.0, 0.0),
                                warmup_per_lane=0)
        run = await replay(cfg, trees, lanes, settings, on_record=on_record)
        left = [t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return run, left

    return asyncio.run(main())


def _serve(tmp_path: Path, *options: str) -> SimServer:
    server = launch(ARGV, ("--hardware", "MI355X", *options), log_dir=tmp_path)
    server.wait_healthy(timeout_s=60)
    return server


def _outcomes(run: ReplayRun) -> dict[tuple[int, int], str]:
    """(lane, turn) of play 0 and 1 -> "ok" or the record's error."""
    return {(q.lane, q.turn): r.error or "ok"
            for q, r in zip(run.requests, run.records, strict=True) if q.play < 2}


def test_a_stream_that_goes_silent_stops_the_replay_and_cancels_the_other_lane(
        tmp_path: Path) -> None:
    """Every stream longer than 8 tokens stops after 8 with its socket open. Lane 0 (trace0)
    stalls in its second turn at once; lane 1 (trace1) sends its second turn half a stall
    timeout later and stalls too, so it is in flight, half a stall timeout from its own, when
    lane 0's stall timeout ends the replay."""
    server = _serve(tmp_path, "--time-scale", "0", "--stall-after-tokens", "8")
    try:
        traces = _traces(tmp_path, [(0.0, 4), (0.0, 32)], [(0.0, 4), (STALL_S / 2, 32)])
        run, left = _replay(server, traces, 2)
        health = httpx.get(server.base_url + "/health", timeout=10).status_code
    finally:
        server.stop()
    assert health == 200  # the server itself was up all along
    assert run.duration_s < BOUND_S and left == []
    assert run.fault.startswith("request trace0 turn 1 (play 0) on lane 0, ")
    assert f"stalled: no data for {STALL_S:g} s" in run.fault
    assert "(--inferbench-stall-timeout)" in run.fault
    assert run.fault.endswith("1 other request(s) in flight cancelled")
    outcomes = _outcomes(run)
    assert outcomes[(0, 0)] == outcomes[(1, 0)] == "ok"
    assert outcomes[(0, 1)] == (f"no data for {STALL_S:g} s after token 8 "
                                "(--inferbench-stall-timeout)")
    assert outcomes[(1, 1)] == "cancelled: the replay stopped (a request on lane 0 lost the server)"
    assert len(run.records) == 4  # nothing was sent after the stop
    cancelled = run.records[-1]
    assert sum(cancelled.chunk_tokens) == 8  # what it received before it was cancelled is kept
    assert not run.cancelled  # the point's deadline played no part


def test_a_stopped_server_stalls_the_replay_which_ends(tmp_path: Path) -> None:
    """SIGSTOP after the first completed request: the process and its sockets live on, nothing
    answers."""
    server = _serve(tmp_path, "--time-scale", "1")
    stopped: list[int] = []

    def stop_server(_: RequestRecord) -> None:
        if not stopped:
            os.kill(server.process.pid, signal.SIGSTOP)
            stopped.append(server.process.pid)

    try:
        traces = _traces(tmp_path, [(0.0, 4), (0.0, 400), (0.0, 400)])
        run, left = _replay(server, traces, 2, on_record=stop_server)
    finally:
        if stopped:
            os.kill(server.process.pid, signal.SIGCONT)
        server.stop()
    assert stopped and run.duration_s < BOUND_S and left == []
    assert "stalled: no data for" in run.fault and " on lane " in run.fault
    assert all(r.success or "stall-timeout" in r.error or r.error.startswith("cancelled: ")
               for r in run.records)


def test_a_killed_server_stops_the_replay_at_once(tmp_path: Path) -> None:
    """SIGKILL after the first completed request, the other lane mid-stream: the next request
    finds no server, the one in flight loses its connection; the replay does not go on
    failing request after request for its minute."""
    server = _serve(tmp_path, "--time-scale", "1")
    killed: list[int] = []

    def kill_server(_: RequestRecord) -> None:
        if not killed:
            os.kill(server.process.pid, signal.SIGKILL)
            killed.append(server.process.pid)

    try:
        traces = _traces(tmp_path, [(0.0, 4), (0.0, 4), (0.0, 4)],
                         [(0.0, 400), (0.0, 400)])
        run, left = _replay(server, traces, 2, on_record=kill_server)
    finally:
        server.stop()
    assert killed and run.duration_s < BOUND_S and left == []
    assert run.fault.startswith("request trace")
    assert " on lane " in run.fault and ", lost the server: connection " in run.fault
    failed = [r.error for r in run.records if not r.success]
    assert failed and all(e.startswith(("connection ", "cancelled: the replay stopped"))
                          for e in failed)
    # Not request after request into a dead server: at most one per lane finds it gone.
    assert sum(e.startswith("connection failed") for e in failed) <= 2
