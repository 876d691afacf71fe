"""The agentic trace replay of a multinode deployment, in process on the virtual clock.

The single-engine replay (`replay_driver.py`) with a `Cluster` in the engine's place: the same
schedule (`loadgen/replay_schedule.py`) says what is due, each due request reaches the
deployment's router with the prompt length, `max_tokens` (one token for a warmup request,
whose record is flagged `warmup`) and per-block prefix keys the HTTP replay's prompt would have
(`replay_prompts`), and the schedule is told when each finished, at the end of the step of the
instance that streamed its last token.

InferenceX's agentic deployments keep a session on the instances its first request went to
(Dynamo's conversation-aware routing, `vllm-router`'s consistent hash on `X-Session-ID`,
`sglang_router`'s routing key, nginx session affinity): here a session is a conversation of
one play of a trace (its root or one subagent), and the deployment's router policy places only
its first request. Each instance keeps its own prefix cache (and CPU-DRAM tier where the point
offloads, sized per worker by its role's argv): a prompt's blocks go to the instance that
computes it -- the aggregated instance, or the prefill instance, whose whole prompt's KV then
moves to the decode instance priced as the fixed-length disaggregated path prices it
(`disagg.KvTransfer`, full prompt). Instances run on engines (`Cluster(lean=False)`: the lean
ones keep no prefix cache) in stretches of identical decode steps, as in `cluster_driver.py`.

A request the deployment can never run (longer than a worker's context) fails at once, as the
server's HTTP 400, under the same failed-request threshold as the single-engine replay.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..loadgen.replay_prompts import prompt_block_keys, prompt_tokens
from ..loadgen.replay_schedule import ReplaySchedule
from ..results.metrics import RequestRecord
from .cluster import Cluster
from .cluster_driver import client_records, deployment_metrics
from .driver import kv_tiers
from .engine import RequestRejectedError
from .replay_driver import (
    SimulatedReplay,
    reject,
    replay_records,
    scheduled_time,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..loadgen.replay_schedule import Dispatch, ReplayConfig, ReplayedRequest
    from ..loadgen.trace_sessions import SessionTree
    from ..results.record import JSONValue
    from .cluster import ClientTrace
    from .disagg import Deployment
    from .state import EngineCounters


# Events in a row at one instant with nothing finished before the replay counts as stalled.
MAX_STILL_EVENTS = 10_000


class _Run:
    """One replay's bookkeeping: what is in the deployment, what finished in which order."""

    def __init__(self, cluster: Cluster, schedule: ReplaySchedule, chat: bool) -> None:
        self.cluster = cluster
        self.schedule = schedule
        self.chat = chat
        self.block_size = cluster.prefix_block_size
        self.sent: dict[int, Dispatch] = {}
        self.done: list[tuple[int, float, ClientTrace]] = []  # (position, send, trace)
        self.prompts: list[int] = []  # prompt tokens, finish order
        self.scheduled: list[float] = []
        self.requests: list[ReplayedRequest] = []
        self.rejected: dict[int, RequestRecord] = {}  # finish position -> its failed record

    def admit(self, dispatch: Dispatch, now: float) -> None:
        turn, trace = dispatch.turn, dispatch.tree.trace
        r = turn.request
        keys = (prompt_block_keys(turn, trace.block_size, dispatch.play, self.block_size,
                                  chat=self.chat) if self.block_size else ())
        tokens = prompt_tokens(r.input_length, chat=self.chat)
        try:
            self.cluster.add_request(dispatch.key, tokens, dispatch.output_tokens,
                                     block_hashes=keys,
                                     session=(dispatch.play, turn.session_id))
        except RequestRejectedError as exc:
            reject(self.rejected, self.requests, self.schedule, dispatch, tokens, exc, now)
            return
        self.sent[dispatch.key] = dispatch

    def finish(self, key: int, now: float) -> None:
        dispatch = self.sent.pop(key)
        self.done.append((len(self.done), dispatch.at, self.cluster.pop_trace(key)))
        self.prompts.append(prompt_tokens(dispatch.turn.request.input_length, chat=self.chat))
        self.scheduled.append(scheduled_time(dispatch))
        self.requests.append(dispatch.described())
        self.schedule.complete(key, now)

    def records(self) -> Sequence[RequestRecord]:
        drafting = any(inst.engine.k for inst in self.cluster.instances)
        served = client_records(self.done, self.prompts, np.asarray(self.scheduled, np.float64),
                                0.0, drafting)
        return replay_records(served, self.requests, self.rejected)


def simulate_cluster_replay(deployment: Deployment, trees: Sequence[SessionTree],
                            concurrency: int, settings: ReplayConfig, *, chat: bool,
                            seed: int = 0) -> SimulatedReplay:
    """Replay `trees` at `concurrency` lanes for `settings.duration_s` virtual seconds on a
    fresh `deployment` from virtual time 0 (module doc)."""
    cluster = Cluster(deployment, seed=seed)
    schedule = ReplaySchedule(trees, concurrency, settings, 0.0)
    run = _Run(cluster, schedule, chat)
    before = {role: cluster.counters(role) for role in cluster.roles}
    still = 0  # events in a row at which nothing moved: a few are sends at one instant
    while True:
        now = cluster.now
        for dispatch in schedule.take(now):
            run.admit(dispatch, now)
        if not cluster.has_work() and schedule.finished(now):
            break
        due = schedule.next_due()
        until = (due if due is not None and due < schedule.end
                 else schedule.end if now < schedule.end else math.inf)
        event = cluster.advance(until=until)
        still = still + 1 if event.now == now and not event.finished else 0
        if still > MAX_STILL_EVENTS:  # a bug, not a load: say so rather than spin
            raise RuntimeError(f"deployment replay stalled at {now:.3f} virtual s: "
                               f"{MAX_STILL_EVENTS} events without a step, transfer or timer")
        for key in event.finished:
            run.finish(key, cluster.now)
    after = {role: cluster.counters(role) for role in cluster.roles}
    return SimulatedReplay(
        records=run.records(), requests=tuple(run.requests), duration_s=cluster.now,
        profile_start=cluster.now if schedule.profile_start is None else schedule.profile_start,
        plays=schedule.plays, plays_completed=schedule.plays_completed,
        server_metrics=replay_metrics(cluster, before, after))


def replay_metrics(cluster: Cluster, before: dict[str, EngineCounters],
                   after: dict[str, EngineCounters]) -> dict[str, JSONValue]:
    """The deployment's scrapes over the replay (`deployment_metrics`) with the prefix cache
    and CPU-DRAM tier of the instances that compute prompts under one server's keys, as a
    single engine's replay reports them, and each role's own hits under its name."""
    out = deployment_metrics(cluster, before, after)
    first = cluster.roles[0]
    a, b = after[first], before[first]
    for role in cluster.roles:
        queries = after[role].prefix_cache_queries - before[role].prefix_cache_queries
        part = out[role]
        if queries and isinstance(part, dict):
            part["prefix_cache_queries"] = queries
            part["prefix_cache_hits"] = (after[role].prefix_cache_hits
                                         - before[role].prefix_cache_hits)
            # Each instance's own cache (a fresh deployment: its counters are the replay's).
            part["prefix_cache_hits_by_instance"] = [
                inst.engine.counters().prefix_cache_hits
                for inst in cluster.instances if inst.role == role]
    queries = a.prefix_cache_queries - b.prefix_cache_queries
    if queries:
        hits = a.prefix_cache_hits - b.prefix_cache_hits
        out.update({"prefix_cache_queries": queries, "prefix_cache_hits": hits,
                    "prefix_cache_hit_rate": hits / queries})
    if a.host_tier:
        out["kv_tiers"] = kv_tiers(b, a)
    transfers = cluster.transfer_seconds
    if transfers:
        out["kv_transfers"] = len(transfers)
        out["mean_kv_transfer_ms"] = float(np.mean(transfers) * 1e3)
        out["max_kv_transfer_ms"] = float(np.max(transfers) * 1e3)
    return out
