"""The agentic replay's schedule on its own (`loadgen/replay_schedule.py`): no clock, no server.

A tiny event loop plays it: each request takes its recorded `api_time` (a warmup one a tenth
of a second) and completes; the schedule says what to send next. The start (agentic.md §3.3):
a seeded t* per lane, primers, per-lane warmups, then profiling. Nested agents (§2.3): every
turn that joins children is sent only after all of them, and so on down the tree.
"""

from __future__ import annotations

import heapq
import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_inferbench.backends.agentic_traces import replay_meta
from pytest_inferbench.loadgen.replay_schedule import FROM_TURN_0, ReplayConfig, ReplaySchedule
from pytest_inferbench.loadgen.replay_start import snapshot, trajectory_start
from pytest_inferbench.loadgen.synthetic_traces import (
    SyntheticTraceSettings,
    write_synthetic_traces,
)
from pytest_inferbench.loadgen.trace_sessions import SessionTree, sessions
from pytest_inferbench.loadgen.traces import load_traces

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pytest_inferbench.loadgen.replay_schedule import Dispatch

WARMUP_TIME = 0.1


def _trees(tmp_path: Path, **settings: int) -> list[SessionTree]:
    file = write_synthetic_traces(tmp_path / "t.jsonl", SyntheticTraceSettings(**settings))
    return [sessions(t) for t in load_traces(file)]


def _play(trees: Sequence[SessionTree], lanes: int, cfg: ReplayConfig,
          fails: Callable[[Dispatch], bool] = lambda d: False, hold_s: float | None = None
          ) -> tuple[list[tuple[Dispatch, float, float]], ReplaySchedule]:
    """Every request as (dispatch, sent, ended), in the order sent; those `fails` picks fail.
    `hold_s`: profiling is held once the warmup drained and begins `hold_s` later."""
    schedule = ReplaySchedule(trees, lanes, cfg, 0.0, hold_profile=hold_s is not None)
    events: list[tuple[float, int]] = []
    out: dict[int, list[object]] = {}
    order: list[int] = []
    now = 0.0
    while True:
        if schedule.held:
            assert hold_s is not None and not events  # nothing in flight while it waits
            assert schedule.take(now) == [] and not schedule.finished(now)
            now += hold_s
            schedule.begin_profile(now)
        for d in schedule.take(now):
            took = WARMUP_TIME if d.warmup else (d.turn.request.api_time or 0.1)
            heapq.heappush(events, (now + took, d.key))
            out[d.key] = [d, now, None]
            order.append(d.key)
        if schedule.finished(now):
            break
        due = schedule.next_due()
        nxt = min([e[0] for e in events[:1]] + ([due] if due is not None else []))
        now = max(now, nxt)
        while events and events[0][0] <= now:
            t, key = heapq.heappop(events)
            out[key][2] = t
            schedule.complete(key, t, failed=fails(out[key][0]))  # type: ignore[arg-type]
    return [tuple(out[k]) for k in order], schedule  # type: ignore[misc]


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another(
        tmp_path: Path) -> None:
    trees = _trees(tmp_path, traces=3, turns=8, subagents=2)
    cfg = ReplayConfig(duration_s=200.0, seed=5)

    def sent(seed: int) -> list[tuple[object, ...]]:
        played, _ = _play(trees, 4, replace(cfg, seed=seed))
        return [(d.lane, d.play, d.turn.session_id, d.turn.index, d.warmup, at)
                for d, at, _ in played]

    assert sent(5) == sent(5)
    assert sent(5) != sent(6)


def test_each_lane_draws_its_own_start_within_the_ratios(tmp_path: Path) -> None:
    tree = _trees(tmp_path, traces=1, turns=12)[0]
    starts = [turn.request.t for turns in tree.streams.values() for turn in turns]
    first, span = min(starts), max(starts) - min(starts)
    drawn = [trajectory_start(tree, 42, lane, 0.25, 0.75) for lane in range(8)]
    assert len(set(drawn)) == len(drawn)  # one tree on eight lanes: eight starts
    assert all(first + 0.25 * span <= t <= first + 0.75 * span for t in drawn)
    assert drawn == [trajectory_start(tree, 42, lane, 0.25, 0.75) for lane in range(8)]
    assert trajectory_start(tree, 42, 0, 0.5, 0.5) == first + 0.5 * span


def test_primers_then_warmups_then_profiling_from_the_live_state(tmp_path: Path) -> None:
    """Each lane's first tree: one primer per stream alive at t* (its last turn before t*),
    then the lane's next K turns in order with no delay, all warmup (one output token); only
    then, once every lane's warmup has completed, is anything profiled, each stream going on
    from where its warmup left it, without a turn sent twice or skipped."""
    trees = _trees(tmp_path, traces=2, turns=20, subagents=0)
    k = 3
    cfg = ReplayConfig(duration_s=100.0, seed=1, warmup_per_lane=k)
    played, schedule = _play(trees, 2, cfg)
    boundary = schedule.profile_start
    assert boundary is not None and boundary > 0
    for lane in range(2):
        first = [(d, at) for d, at, _ in played if d.lane == lane and d.play == lane]
        tree = first[0][0].tree
        start = snapshot(tree, trajectory_start(tree, 1, lane, 0.25, 0.75))
        root = tree.trace.id
        resume = start.resume[root]
        assert 0 < resume < len(tree.streams[root]) - k
        turns = [d.turn.index for d, _ in first]
        # The primer, K warmups, then the profiled turns: consecutive, none skipped.
        assert turns == list(range(resume - 1, resume - 1 + len(turns)))
        warm = [d for d, _ in first if d.warmup]
        assert len(warm) == 1 + k
        assert all(d.output_tokens == 1 for d in warm)
        assert all(at <= boundary for d, at in first if d.warmup)
        profiled = [(d, at) for d, at in first if not d.warmup]
        assert profiled and all(at >= boundary for _, at in profiled)
        assert profiled[0][0].output_tokens == max(1, profiled[0][0].turn.request.output_length)
    # Profiling starts when the last warmup request completes, not before.
    assert boundary == max(end for d, _, end in played if d.warmup)
    assert schedule.end == boundary + cfg.duration_s


def test_a_held_profiling_phase_begins_when_released_and_keeps_its_timing(
        tmp_path: Path) -> None:
    """Held at the end of the warmup (the HTTP replay reads the server's counters there),
    nothing is sent and the replay is not over; released later, the profiling phase is the
    unheld one moved by the hold, request for request: the hold delays no request."""
    trees = _trees(tmp_path, traces=2, turns=12, subagents=1)
    cfg = ReplayConfig(duration_s=60.0, seed=3, warmup_per_lane=2)
    played, schedule = _play(trees, 3, cfg)
    held, held_schedule = _play(trees, 3, cfg, hold_s=0.5)
    assert schedule.profile_start is not None
    assert held_schedule.profile_start == schedule.profile_start + 0.5
    assert held_schedule.end == schedule.end + 0.5
    def sent(run: list[tuple[Dispatch, float, float]]) -> list[tuple[object, ...]]:
        return [(d.lane, d.play, d.turn.session_id, d.turn.index, d.warmup) for d, _, _ in run]

    assert sent(held) == sent(played)
    assert [at if d.warmup else at - 0.5 for d, at, _ in held] == pytest.approx(
        [at for _, at, _ in played])


def test_a_stream_resumes_at_its_recorded_offset_from_t_star(tmp_path: Path) -> None:
    """With no warmup requests, each stream's first profiled turn leaves the recorded time
    after t* (or after its previous turn's recorded end, if later) after the boundary."""
    trees = _trees(tmp_path, traces=1, turns=10, subagents=0)
    cfg = ReplayConfig(duration_s=100.0, seed=3, warmup_per_lane=0)
    played, schedule = _play(trees, 1, cfg)
    tree = trees[0]
    t_star = trajectory_start(tree, 3, 0, 0.25, 0.75)
    resume = snapshot(tree, t_star).resume[tree.trace.id]
    primer, next_turn = tree.streams[tree.trace.id][resume - 1:resume + 1]
    profiled = next((d, at) for d, at, _ in played if not d.warmup)
    assert profiled[0].turn == next_turn
    offset = next_turn.request.t - max(t_star, primer.request.end)
    assert schedule.profile_start is not None
    assert profiled[1] == pytest.approx(schedule.profile_start + offset)


def test_from_turn_0_measures_every_request_of_every_play(tmp_path: Path) -> None:
    trees = _trees(tmp_path, traces=2, turns=4, subagents=1)
    played, schedule = _play(trees, 2, ReplayConfig(duration_s=50.0, **FROM_TURN_0))
    assert schedule.profile_start == 0.0
    assert not any(d.warmup for d, _, _ in played)
    firsts = [d for d, _, _ in played if d.turn.index == 0 and d.play < 2
              and d.turn.session_id == d.tree.trace.id]
    assert [d.play for d in firsts] == [0, 1]


def _joins_hold(played: Sequence[tuple[Dispatch, float, float]]) -> int:
    """Assert that every turn that joins children was sent after each of them (and thus, each
    of them having waited for its own, after everything under it) ended; the joins seen."""
    ends: dict[tuple[int, str], float] = {}
    for d, _, end in played:
        ends[(d.play, d.turn.session_id)] = max(end, ends.get((d.play, d.turn.session_id), 0))
    seen = 0
    for d, at, _ in played:
        for link in d.tree.links:
            if d.tree.parent_of(link) == d.turn.session_id and link.join_turn == d.turn.index:
                child = ends.get((d.play, link.session_id))
                if child is not None:
                    assert at >= child, (d.turn.session_id, d.turn.index, link.session_id)
                    seen += 1
    return seen


def test_nested_agents_join_at_every_level(tmp_path: Path) -> None:
    trees = _trees(tmp_path, traces=2, turns=4, subagents=2, subagent_turns=3, nested=2)
    tree = trees[0]
    depth = {tree.trace.id: 0}
    for link in tree.links:
        depth[link.session_id] = depth[tree.parent_of(link)] + 1
    assert max(depth.values()) == 3  # root > subagent > nested > nested under it
    assert all(link.join_turn is not None for link in tree.links)
    played, _ = _play(trees, 1, ReplayConfig(duration_s=500.0, **FROM_TURN_0))
    # One lane plays one tree at a time; every level joined, play after play.
    assert _joins_hold(played) >= 2 * len(tree.links)
    # And the order is the recorded one: within a play, turns go in recorded start order.
    first = [d.turn.request.t for d, _, _ in played if d.play == 0]
    assert first == sorted(first)


def test_the_theoretical_hit_rate_counts_the_profiled_requests_only(tmp_path: Path) -> None:
    """A primer's theoretical hit assumes the history it stands for was sent: it was not."""
    trees = _trees(tmp_path, traces=2, turns=10, subagents=1)
    cfg = ReplayConfig(duration_s=60.0, seed=2)
    played, _ = _play(trees, 2, cfg)
    requests = [d.described() for d, _, _ in played]
    warm = [q for q in requests if q.warmup]
    assert warm and sum(q.hit_blocks for q in warm) > 0
    meta = replay_meta(8, cfg, requests, clock_start=0.0, start_unix=0.0)
    assert meta.hit_blocks == sum(q.hit_blocks for q in requests if not q.warmup)
    assert meta.total_blocks == sum(q.total_blocks for q in requests if not q.warmup)


def test_a_lane_whose_first_tree_runs_out_in_the_warmup_starts_the_next_with_profiling(
        tmp_path: Path) -> None:
    trees = _trees(tmp_path, traces=2, turns=3, subagents=0)
    played, schedule = _play(trees, 1, ReplayConfig(duration_s=30.0, seed=1))
    first = [d for d, _, _ in played if d.play == 0]
    assert first and all(d.warmup for d in first)  # fewer turns after t* than warmups
    second = [(d, at) for d, at, _ in played if d.play == 1]
    assert second[0][0].turn.index == 0 and not second[0][0].warmup
    assert second[0][1] == schedule.profile_start == max(end for d, _, end in played
                                                         if d.play == 0)


def _gaps(tmp_path: Path) -> SessionTree:
    """A root of three turns (0, 0.5, 6.6 s) and a subagent its turn 0 spawns, with turns at
    0.2 and 0.6 s, joined by root turn 2."""
    def req(t: float, blocks: list[int]) -> dict[str, object]:
        return {"t": t, "type": "n", "model": "x", "in": 64 * len(blocks), "out": 4,
                "hash_ids": blocks, "api_time": 0.1}
    trace = {"id": "gaps", "models": ["x"], "block_size": 64, "hash_id_scope": "local",
             "requests": [
                 req(0.0, [0, 1]),
                 {"t": 0.2, "type": "subagent", "agent_id": "sa1", "subagent_type": "Subagent",
                  "status": "completed", "models": ["x"], "duration_ms": 500,
                  "requests": [req(0.2, [0, 5]), req(0.6, [0, 5, 6])]},
                 req(0.5, [0, 1, 2]), req(6.6, [0, 1, 2, 3])]}
    path = tmp_path / "gaps.jsonl"
    path.write_text(json.dumps(trace) + "\n", encoding="utf-8")
    return sessions(load_traces(path)[0])


@pytest.mark.parametrize(("t_star", "resume", "done", "pending"), [
    (0.1, {"gaps": 1}, set(), {"gaps::sa:sa1"}),  # spawned, not started: no primer
    (0.3, {"gaps": 1, "gaps::sa:sa1": 1}, set(), set()),  # both alive: a primer each
    (0.65, {"gaps": 2}, {"gaps::sa:sa1"}, set()),  # the subagent over: nothing of it sent
    (5.0, {"gaps": 2}, {"gaps::sa:sa1"}, set()),  # the root waits for its third turn
])
def test_the_snapshot_at_t_star(tmp_path: Path, t_star: float, resume: dict[str, int],
                                done: set[str], pending: set[str]) -> None:
    start = snapshot(_gaps(tmp_path), t_star)
    assert (start.resume, set(start.done), set(start.pending)) == (resume, done, pending)


def test_a_child_spawned_before_t_star_starts_after_the_primers(tmp_path: Path) -> None:
    """t* = 0.1 s, between the spawn and the subagent's first turn: the root's primer, then
    the subagent's first turn (recorded before the root's next) as the lane's one warmup
    request; then profiling, each stream at its recorded offset: the subagent's turn 1 at
    0.6 - 0.3 (its previous turn's end) after the boundary, the root's turn 1 at 0.5 - 0.1."""
    tree = _gaps(tmp_path)
    span = 6.6
    cfg = ReplayConfig(duration_s=20.0, trajectory_start=(0.1 / span, 0.1 / span),
                       warmup_per_lane=1)
    played, schedule = _play([tree], 1, cfg)
    first = [(d.turn.session_id, d.turn.index, d.warmup, at) for d, at, _ in played
             if d.play == 0]
    assert [f[:3] for f in first[:4]] == [("gaps", 0, True), ("gaps::sa:sa1", 0, True),
                                          ("gaps::sa:sa1", 1, False), ("gaps", 1, False)]
    assert schedule.profile_start is not None
    assert first[2][3] == pytest.approx(schedule.profile_start + 0.3)
    assert first[3][3] == pytest.approx(schedule.profile_start + 0.4)


def _primers(played: Sequence[tuple[Dispatch, float, float]], lanes: int
             ) -> list[tuple[Dispatch, float]]:
    """Each first tree's primers: the first request of every stream it sends in the warmup
    that resumes at t* (a stream's first warmup request whose turn lies before t*)."""
    seen: set[tuple[int, str]] = set()
    out = []
    for d, at, _ in played:
        key = (d.play, d.turn.session_id)
        if d.play < lanes and d.warmup and key not in seen:
            seen.add(key)
            out.append((d, at))
    return out


def test_primers_are_spread_so_every_lanes_t_star_lands_on_one_instant(tmp_path: Path) -> None:
    """Each primer leaves its recorded lead before its lane's t* ahead of one instant, the same
    for every lane; the one with the longest lead leaves at the start (caps out of reach)."""
    trees = _trees(tmp_path, traces=3, turns=12, subagents=0)
    lanes, seed = 3, 7
    cfg = ReplayConfig(duration_s=30.0, seed=seed, warmup_per_lane=0, system_idle_cap_s=1e6,
                       trace_idle_cap_s=1e6)
    played, _ = _play(trees, lanes, cfg)
    primers = _primers(played, lanes)
    assert len(primers) == lanes
    landing = []
    for d, at in primers:
        t_star = trajectory_start(d.tree, seed, d.lane, *cfg.trajectory_start)
        assert d.turn.request.t < t_star
        landing.append(at + (t_star - d.turn.request.t))
    assert min(at for _, at in primers) == 0.0
    assert len({at for _, at in primers}) == lanes  # spread, not all at once
    assert max(landing) - min(landing) == pytest.approx(0.0, abs=1e-9)


def test_the_idle_caps_shorten_the_primers_spread(tmp_path: Path) -> None:
    """A lead longer than the system idle cap is pulled in as any timer: with nothing in flight
    the next primer leaves within the cap, and the others keep their spacing."""
    trees = _trees(tmp_path, traces=3, turns=12, subagents=0)
    lanes, seed, cap = 3, 7, 0.05
    spread = _primers(_play(trees, lanes, ReplayConfig(
        duration_s=30.0, seed=seed, warmup_per_lane=0, system_idle_cap_s=1e6,
        trace_idle_cap_s=1e6))[0], lanes)
    capped = _primers(_play(trees, lanes, ReplayConfig(
        duration_s=30.0, seed=seed, warmup_per_lane=0, system_idle_cap_s=cap,
        trace_idle_cap_s=1e6))[0], lanes)
    def gaps(primers: list[tuple[Dispatch, float]]) -> list[float]:
        return [b - a for a, b in itertools.pairwise(sorted(at for _, at in primers))]

    assert max(gaps(spread)) > WARMUP_TIME + cap  # a gap the cap shortens
    assert [d.lane for d, _ in sorted(capped, key=lambda p: p[1])] == \
        [d.lane for d, _ in sorted(spread, key=lambda p: p[1])]
    for before, after in zip(gaps(spread), gaps(capped), strict=True):
        assert after == pytest.approx(min(before, WARMUP_TIME + cap))


def test_a_failed_root_warmup_request_aborts_the_replay(tmp_path: Path) -> None:
    """AIPerf aborts before profiling when a root stream's warmup request fails: nothing more is
    sent, profiling never begins, and the schedule says why."""
    trees = _trees(tmp_path, traces=2, turns=12, subagents=0)
    played, schedule = _play(trees, 2, ReplayConfig(duration_s=30.0, seed=1),
                             fails=lambda d: d.warmup and d.lane == 1)
    assert schedule.aborted is not None
    assert "warmup request of root stream" in schedule.aborted and "lane 1" in schedule.aborted
    assert schedule.profile_start is None
    assert all(d.warmup for d, _, _ in played)
    failed_at = min(end for d, _, end in played if d.lane == 1)
    assert all(at <= failed_at for _, at, _ in played)  # nothing sent after the failure
    assert schedule.finished(failed_at) and schedule.take(failed_at + 1.0) == []


def test_a_failed_subagent_warmup_request_does_not_abort(tmp_path: Path) -> None:
    """t* = 0.3 s: the root and the subagent are both alive and each sends a primer; the
    subagent's fails, and the replay goes on to profile."""
    tree = _gaps(tmp_path)
    cfg = ReplayConfig(duration_s=20.0, trajectory_start=(0.3 / 6.6, 0.3 / 6.6),
                       warmup_per_lane=1)
    played, schedule = _play([tree], 1, cfg,
                             fails=lambda d: d.warmup and d.turn.session_id == "gaps::sa:sa1")
    assert any(d.warmup and d.turn.session_id == "gaps::sa:sa1" for d, _, _ in played)
    assert schedule.aborted is None and schedule.profile_start is not None
    assert any(not d.warmup for d, _, _ in played)
