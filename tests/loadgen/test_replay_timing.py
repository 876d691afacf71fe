"""Done-when check: the agentic replay sends every request when the trace says, to within 5 ms,
judged by the simulated server's own timeline.

The shipped 3-trace corpus replays at three lanes against the simulator at time scale 1 (real
time). The server records when each request arrived and when it sent each token
(`/debug/inferbench/timeline`, CLOCK_MONOTONIC, the clock of the client's `perf_counter`). From
that timeline alone (the end of each request is its last token as the server sent it) the test
derives when each request should have left, by the rules of agentic.md §3.4:

- a stream's next turn: the previous turn's end plus the recorded end-to-start gap;
- a child's first turn: the end of the parent turn that spawns it plus its offset in the branch;
- a turn that joins children: not before the last of them ended;
- a stream alive at the lane's t*: profiling start plus its recorded offset from t*;
- a recycled lane's next tree: when the previous one drained;
- the per-tree idle cap: once the tree has nothing in flight, its pending turn is due at most
  the cap after that moment (set to 2.75 s here so that it binds within the run: it shortens
  the 3 s gap of the linear trace and the 1200 s one of the idle trace; the 2.5 s and 1.5 s
  gaps stay as recorded). The system cap (10 s) cannot bind below a shorter per-tree cap.

The warmup before it (§3.3) is held to its own rules: a primer leaves its recorded lead before
its lane's t* ahead of the instant the longest lead sets (under the same per-tree cap, which
moves a tree's primers as one), and a lane's warmup request (one here, InferenceX's fast mode)
leaves when the lane's primers are done; profiling starts when the last warmup request ended.

When the request left is the client's last write or the server's arrival stamp, whichever came
first (the server starts a request on its headers, the client stamps the end of its body). It
must lie within 5 ms of when it should have, plus the client's own event-loop stalls over the
two moments where lateness can enter (while the end that made it ready reached the client, and
from its due time to its send), as `test_loadgen_timing.py` bounds its stamps: a loaded machine
widens the bound only by what it did to the client, and a client that sends late for its own
reasons fails (one that waited 6 ms too long on every timer did).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest
from shared_data import CORPUS

from pytest_inferbench.loadgen.client import CHAT_ENDPOINT, ClientConfig
from pytest_inferbench.loadgen.replay import ReplayConfig, ReplayRun, replay
from pytest_inferbench.loadgen.replay_start import snapshot, trajectory_start
from pytest_inferbench.loadgen.selfcheck import DEFAULT_INTERVAL_S, LoopMonitor, LoopStats
from pytest_inferbench.loadgen.trace_sessions import sessions
from pytest_inferbench.loadgen.traces import load_traces
from pytest_inferbench.sim.server.launcher import launch

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_inferbench.loadgen.replay_config import ReplayedRequest
    from pytest_inferbench.loadgen.trace_sessions import SessionTree
    from pytest_inferbench.results.metrics import RequestRecord

MODEL = "amd/MiniMax-M3-MXFP4"
LANES = 3
TARGET_S = 0.005
TRACE_CAP_S = 2.75
SETTINGS = ReplayConfig(duration_s=12.0, trace_idle_cap_s=TRACE_CAP_S, warmup_per_lane=1,
                        seed=42)

Key = tuple[int, str, int]  # play, session, turn


async def _replay(cfg: ClientConfig, trees: Sequence[SessionTree]) -> tuple[ReplayRun, LoopStats]:
    monitor = LoopMonitor()
    monitor.start()
    try:
        run = await replay(cfg, trees, LANES, SETTINGS)
    finally:
        stats = await monitor.stop()
    return run, stats


class Truth:
    """The server's timeline of a replay, joined to the client's records."""

    def __init__(self, run: ReplayRun, timeline: dict[str, Any], stats: LoopStats,
                 trees: Sequence[SessionTree]) -> None:
        offset = float(timeline["perf_counter_minus_monotonic"])
        by_id = {t["id"]: t for t in timeline["requests"]}
        self.trees = {t.trace.id: t for t in trees}
        self.pairs: dict[Key, tuple[ReplayedRequest, RequestRecord]] = {}
        self.arrival: dict[Key, float] = {}
        self.end: dict[Key, float] = {}  # the last token as the server sent it
        for q, r in zip(run.requests, run.records, strict=True):
            key = (q.play, q.session_id, q.turn)
            t = by_id[r.request_id]
            self.pairs[key] = (q, r)
            self.arrival[key] = t["arrival"] + offset
            self.end[key] = max(e[0] for e in t["emissions"]) + offset
        warmup = [k for k, (q, _) in self.pairs.items() if q.warmup]
        self.profile_start = max(self.end[k] for k in warmup)
        # The moment profiling began, as the server ended it and as the client saw it.
        self.boundary = (self.profile_start, run.profile_start)
        self.lags = np.column_stack([stats.due_s, stats.lag_s])

    def ended(self, key: Key) -> tuple[float, float]:
        """When the request ended: its last token as the server sent it, and as the client
        saw the response end."""
        return self.end[key], self.pairs[key][1].end_time

    def stalled(self, *windows: tuple[float, float]) -> float:
        """How long the client's event loop was unresponsive within the windows (s): the
        ticker's lateness, each tick's stall [due, due + lag] clipped to them. A window opens
        one ticker interval early: a wake-up not yet due when the moment came could not
        notice it sooner."""
        due, lag = self.lags[:, 0], self.lags[:, 1]
        merged: list[list[float]] = []
        for start, end in sorted((a - DEFAULT_INTERVAL_S, b) for a, b in windows):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return sum(float(np.clip(np.minimum(due + lag, b) - np.maximum(due, a), 0, None).sum())
                   for a, b in merged)

    def sent(self, key: Key) -> float:
        """When the request left: the client's last write, or the server's arrival stamp if
        that came first (the server starts a request on its headers)."""
        return min(self.pairs[key][1].send_time, self.arrival[key])

    def due(self, key: Key) -> tuple[float, tuple[float, float], str]:
        """When the request should have left, the end that made it ready (as the server sent
        it and as the client saw it: a stall in between delays what the client knew), and
        which rule set it."""
        play, session, turn = key
        q, _ = self.pairs[key]
        tree = self.trees[q.trace_id]
        stream = tree.streams[session]
        ready, timer = self.boundary, None
        previous = (play, session, turn - 1)
        if turn and previous in self.pairs:
            ready = max(ready, self.ended(previous))
            if self.pairs[previous][0].warmup:  # resumes at its recorded offset from t*
                timer, kind = self.profile_start + self._from_t_star(tree, q.lane, session,
                                                                     turn), "resume"
            else:
                timer = ready[0] + float(q.delay_s or 0.0)
                kind = "capped gap" if (q.delay_s or 0.0) > TRACE_CAP_S else "gap"
        elif session != tree.trace.id:  # a child's first turn
            link = next(k for k in tree.links if k.session_id == session)
            parent = tree.parent_of(link)
            spawn = (play, parent, link.spawn_turn)
            if spawn in self.pairs and not self.pairs[spawn][0].warmup:
                branch = [tree.streams[k.session_id][0].request.t for k in tree.links
                          if tree.parent_of(k) == parent
                          and (k.spawn_turn, k.join_turn) == (link.spawn_turn, link.join_turn)]
                ready = self.ended(spawn)
                timer, kind = ready[0] + stream[0].request.t - min(branch), "spawn"
            else:  # spawned before profiling: its recorded offset from t*
                timer = self.profile_start + self._from_t_star(tree, q.lane, session, 0)
                kind = "resume"
        else:  # a recycled lane's next tree starts when the previous one drained
            lane = [k for k, (p, _) in self.pairs.items() if p.lane == q.lane and k[0] < play]
            last = max(k[0] for k in lane)
            ready = max(ready, *(self.ended(k) for k in lane if k[0] == last))
            kind = "recycle"
        for link in tree.links:  # a joining turn waits for the children it joins
            if tree.parent_of(link) == session and link.join_turn == turn:
                kind = "join"
                ready = max(ready, *(self.ended(k) for k in self.pairs
                                     if k[0] == play and k[1] == link.session_id))
        if timer is None:
            return ready[0], ready, kind
        # The per-tree idle cap, from when the tree last had nothing in flight.
        others = [k for k in self.pairs
                  if k[0] == play and k != key and self.sent(k) < self.sent(key)]
        idle_since = max(self.end[k] for k in others) if others else ready[0]
        return max(ready[0], min(timer, idle_since + SETTINGS.trace_idle_cap_s)), ready, kind

    def warmup_due(self, key: Key, start: tuple[float, float]
                   ) -> tuple[float, tuple[float, float], str]:
        """As `due`, for a warmup request: a primer leaves its recorded lead before its lane's
        t* ahead of the instant the longest lead sets (that one at the start, `start`); a
        lane's warmup request once the lane's primers are done."""
        leads = self._primer_leads()
        if key not in leads:
            done = max(self.ended(k) for k in leads if k[0] == key[0])
            return done[0], done, "warmup"
        def timer(primer: Key) -> float:
            return start[0] + max(leads.values()) - leads[primer]

        # The per-tree idle cap (nothing in flight in the tree since the start) pulls the
        # tree's earliest primer in, and its others by as much.
        earliest = min(timer(k) for k in leads if k[0] == key[0])
        shift = max(0.0, earliest - (start[0] + SETTINGS.trace_idle_cap_s))
        return timer(key) - shift, start, "primer"

    def _primer_leads(self) -> dict[Key, float]:
        """Each primer (a stream's last turn before its lane's t*) and how long before t* it
        was recorded to start."""
        leads = {}
        for play in range(LANES):
            q = next(p for k, (p, _) in self.pairs.items() if k[0] == play)
            tree = self.trees[q.trace_id]
            t_star = trajectory_start(tree, SETTINGS.seed, q.lane, *SETTINGS.trajectory_start)
            for session, resume in snapshot(tree, t_star).resume.items():
                turn = tree.streams[session][resume - 1]
                leads[(play, session, turn.index)] = t_star - turn.request.t
        return leads

    def _from_t_star(self, tree: SessionTree, lane: int, session: str, turn: int) -> float:
        t_star = trajectory_start(tree, SETTINGS.seed, lane, *SETTINGS.trajectory_start)
        turns = tree.streams[session]
        if turn:
            before = turns[turn - 1].request.end
        else:
            link = next(k for k in tree.links if k.session_id == session)
            before = tree.streams[tree.parent_of(link)][link.spawn_turn].request.end
        return max(0.0, turns[turn].request.t - max(t_star, before))


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.exists(), reason="the shared agentic corpus is not here")
def test_every_request_leaves_within_5ms_of_its_schedule(tmp_path: Path) -> None:
    argv = ("vllm", "serve", MODEL, "--tensor-parallel-size", "4", "--block-size", "16")
    server = launch(argv, ("--hardware", "MI355X", "--time-scale", "1"), log_dir=tmp_path)
    try:
        server.wait_healthy(timeout_s=60)
        trees = [sessions(t) for t in load_traces(CORPUS)]
        cfg = ClientConfig(base_url=server.base_url, model=MODEL, endpoint=CHAT_ENDPOINT,
                           concurrency=LANES)
        run, stats = asyncio.run(_replay(cfg, trees))
        timeline = httpx.get(server.base_url + "/debug/inferbench/timeline", timeout=30).json()
    finally:
        server.stop()
    assert all(r.success for r in run.records)
    truth = Truth(run, timeline, stats, trees)
    assert run.profile_start >= truth.profile_start  # the client saw the warmup drain
    rows = []
    for key, (q, _) in truth.pairs.items():
        should, known, kind = (truth.warmup_due(key, (run.start, run.start)) if q.warmup
                               else truth.due(key))
        late = truth.sent(key) - should
        # Lateness enters where the end that made it ready travelled to the client, and from
        # the due time to the send.
        allowed = TARGET_S + truth.stalled(known, (should, truth.sent(key)))
        rows.append((key, kind, late, allowed))
    late_ms = np.asarray([row[2] for row in rows]) * 1000
    intake_ms = np.asarray([truth.arrival[k] - truth.pairs[k][1].send_time for k in truth.pairs])
    print(f"\n{len(rows)} requests (profiling: {run.duration_s:.1f} s): sent minus due "
          f"median {np.median(late_ms):.2f} ms, min {late_ms.min():.2f}, max {late_ms.max():.2f}"
          f"; server arrival minus the client's wire stamp: median "
          f"{np.median(intake_ms) * 1000:.2f} ms; client stalls of 2 ms or more: "
          f"{int((stats.lag_s >= 0.002).sum())}, longest {stats.lag_s.max() * 1000:.1f} ms; client "
          f"CPU {stats.cpu_fraction:.0%} of one core")
    for key, kind, late, allowed in rows:
        print(f"  {kind:10} {key}: {late * 1000:+.2f} ms (allowed {allowed * 1000:.2f})")
    # Every rule of the schedule decided some request's due time within the run.
    assert {row[1] for row in rows} == {"primer", "warmup", "gap", "capped gap", "resume",
                                        "spawn", "recycle", "join"}
    for key, _, late, allowed in rows:
        # Never before its time (1 ms: the clocks' offset is read once), never later than the
        # target beyond what the client's stalls explain.
        assert -0.001 <= late <= allowed, (key, late, allowed)
