"""Virtual-time driver of one benchmark point against a multinode deployment (`Cluster`).

The same client as `driver.py`: the point's `workload.Workload`, warmup requests first under
the same concurrency (excluded), then the measured ones, C in flight, each finish sending the
next at that instant (or, in an open loop, each at its offset once a slot is free). Times are
virtual seconds from the start of the measured phase. Server metrics are scraped per role.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from ..results.measurement import ENGINE_COUNTERS
from ..results.metrics import RequestRecord, StepRecords
from ..results.request_records import ONE_PER_CHUNK, chunk_token_sums
from .closed_loop import fits_whole
from .cluster import ClientTrace, Cluster
from .driver import SimulatedPoint, counter_deltas, record_tokens
from .engine import RequestRejectedError
from .instance import Declined

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy.typing as npt

    from ..loadgen.workload import Workload
    from ..results.record import JSONValue
    from .disagg import Deployment
    from .state import EngineCounters


def _run_load(cluster: Cluster, isl: list[int], osl: list[int],
              arrivals: npt.NDArray[np.float64], concurrency: int, first_id: int
              ) -> list[tuple[int, float, ClientTrace]]:
    start = cluster.now
    pending = deque(range(len(isl)))
    in_flight: dict[int, tuple[int, float]] = {}
    slot_free_at = deque([start] * concurrency)
    done: list[tuple[int, float, ClientTrace]] = []

    def send_due() -> None:
        while (pending and len(in_flight) < concurrency
               and start + arrivals[pending[0]] <= cluster.now):
            i = pending.popleft()
            t_send = max(start + float(arrivals[i]), slot_free_at.popleft())
            in_flight[first_id + i] = (i, t_send)
            cluster.add_request(first_id + i, isl[i], osl[i])

    send_due()
    while pending or in_flight:
        due = (start + float(arrivals[pending[0]]) if pending and len(in_flight) < concurrency
               else np.inf)
        before = cluster.now
        event = cluster.advance(until=due)
        if not event.finished and event.now == before and not cluster.has_work() and (
                due == np.inf):
            raise RuntimeError("deployment stalled with requests in flight")
        for rid in event.finished:
            i, t_send = in_flight.pop(rid)
            done.append((i, t_send, cluster.pop_trace(rid)))
            slot_free_at.append(cluster.now)
        send_due()
    return done


def _warmup_leaves_no_trace(cluster: Cluster, isl: npt.NDArray[np.int64],
                            osl: npt.NDArray[np.int64], concurrency: int) -> bool:
    """Whether a warmup on this idle deployment would leave nothing behind that the measured
    phase sees but the router's turns and the acceptance draws of its decode plans: routers
    that pick without reading loads, no jitter stream to advance, every request admissible,
    and with speculative decoding where tokens are generated as many requests as can run at
    once fit one instance's KV cache whole, so none is ever preempted (a re-admission draws a
    new plan). A prefill instance's plans are of no tokens: nothing it draws is ever seen."""
    if cluster.has_work() or not len(isl) or min(int(isl.min()), int(osl.min())) < 1:
        return False
    if cluster.router.policy == "load-aware" and max(cluster.router.sizes) > 1:
        return False
    if any(inst.engine.config.jitter > 0 for inst in cluster.instances):
        return False
    longest = int(np.argmax(isl + osl))
    for pool in cluster.pools:
        try:
            cluster.check_fits(pool[0].engine, int(isl[longest]), int(osl[longest]))
        except RequestRejectedError:
            return False  # the deployment rejects it: the warmup runs, and says why
    serving = cluster.pools[-1][0].engine
    return not serving.k or fits_whole(serving, isl, osl, concurrency)


def _skip_warmup(cluster: Cluster, osl: npt.NDArray[np.int64]) -> None:
    """What the warmup would leave: the router's picks made in its order (a prefill instance
    then a decode instance per request), and each instance's acceptance stream moved on by
    the plans of the requests it was given (a prefill instance's of one token)."""
    disaggregated = len(cluster.pools) > 1
    for max_tokens in osl.tolist():
        first = cluster.pools[0][cluster.router.pick(0, [])].engine
        if disaggregated:
            first.draw_decode_plans(np.ones(1, dtype=np.int64))
            cluster.pools[1][cluster.router.pick(1, [])].engine.draw_decode_plans(
                np.array([max_tokens], dtype=np.int64))
        else:
            first.draw_decode_plans(np.array([max_tokens], dtype=np.int64))


def simulate_deployment_point(deployment: Deployment, workload: Workload, *,
                              seed: int = 0, stretch: bool = True,
                              warmup_shortcut: bool = True,
                              lean: bool = True) -> SimulatedPoint:
    """`stretch=False` runs every instance one step at a time (as the HTTP server does);
    `warmup_shortcut=False` runs the warmup even where it leaves no trace; `lean=False` runs
    a disaggregated deployment's instances on engines even where `PrefillInstance` and
    `DecodeInstance` follow them."""
    if lean and stretch and deployment.disaggregated and all(
            pool.config.jitter <= 0 for pool in deployment.pools):
        try:
            return _simulate(Cluster(deployment, seed=seed, lean=True), workload,
                             warmup_shortcut)
        except Declined:
            pass  # its engine would preempt: the point runs on engines from the start
    return _simulate(Cluster(deployment, seed=seed, stretch=stretch), workload, warmup_shortcut)


def _simulate(cluster: Cluster, workload: Workload, warmup_shortcut: bool) -> SimulatedPoint:
    if workload.warmup and warmup_shortcut and _warmup_leaves_no_trace(
            cluster, *workload.warmup_length_arrays, workload.concurrency):
        _skip_warmup(cluster, workload.warmup_length_arrays[1])
    elif workload.warmup:
        warm_isl, warm_osl = workload.warmup_length_arrays
        _run_load(cluster, warm_isl.tolist(), warm_osl.tolist(), np.zeros(len(warm_isl)),
                  workload.concurrency, first_id=1 << 40)
    for inst in cluster.instances:  # peaks of the measured phase only
        inst.engine.counters_state.peak_usage = 0.0
        inst.engine.counters_state.peak_waiting = 0
    before = {role: cluster.counters(role) for role in cluster.roles}
    transfers_before = len(cluster.transfer_seconds)
    t0 = cluster.now
    isl, osl = workload.input_lens, workload.output_lens
    open_loop = workload.send_offsets is not None
    arrivals = (np.asarray(workload.send_offsets, dtype=np.float64) if open_loop
                else np.zeros(len(isl)))
    done = _run_load(cluster, isl, osl, arrivals, workload.concurrency, first_id=0)
    drafting = any(inst.engine.k for inst in cluster.instances)
    records = _records(done, isl, arrivals if open_loop else None, t0, drafting)
    queue_s = np.zeros(len(isl))
    for i, t_send, trace in done:
        queue_s[i] = max(trace.first_scheduled_s - t_send, 0.0)
    after = {role: cluster.counters(role) for role in cluster.roles}
    metrics = deployment_metrics(cluster, before, after)
    transfers = cluster.transfer_seconds[transfers_before:]
    if transfers:
        metrics["mean_kv_transfer_ms"] = float(np.mean(transfers) * 1e3)
        metrics["max_kv_transfer_ms"] = float(np.max(transfers) * 1e3)
    if len(isl):
        metrics["mean_queue_time_ms"] = float(queue_s.mean() * 1e3)
        metrics["max_queue_time_ms"] = float(queue_s.max() * 1e3)
    return SimulatedPoint(records, cluster.now - t0, metrics)


def _records(done: list[tuple[int, float, ClientTrace]], isl: list[int],
             scheduled: npt.NDArray[np.float64] | None, t0: float, drafting: bool
             ) -> Sequence[RequestRecord]:
    """The finished requests' records in send order, times from `t0`: columns over the
    streaming instances' timelines laid end to end (each request's chunks at consecutive
    steps of one of them), or one record each where an engine broke a request's run of steps
    (a preemption)."""
    if len(done) != len(isl) or not all(isinstance(trace.steps, slice) for _, _, trace in done):
        return _record_per_request(done, isl, scheduled, t0, drafting)
    n = len(done)
    base: dict[int, int] = {}  # id of an instance's timeline -> where its steps start
    ends: list[npt.NDArray[np.float64]] = []
    send, first_step, chunks = np.empty(n), np.empty(n, np.int64), np.empty(n, np.int64)
    per_request: list[npt.NDArray[np.int64]] = [ONE_PER_CHUNK] * n
    laid = 0
    for i, t_send, trace in done:
        timeline, steps = trace.timeline, trace.steps
        assert isinstance(steps, slice)
        at = base.get(id(timeline))
        if at is None:
            at = base[id(timeline)] = laid
            ends.append(timeline.ends[:timeline.n])
            laid += timeline.n
        send[i] = t_send - t0
        first_step[i] = at + steps.start
        chunks[i] = steps.stop - steps.start
        per_request[i] = trace.tokens
    tokens = np.concatenate(per_request) if drafting and n else None
    return StepRecords(
        send_time=send, input_tokens=np.asarray(isl, np.int64),
        output_tokens=chunks if tokens is None else chunk_token_sums(tokens, chunks),
        first_step=first_step, chunks=chunks,
        step_ends=np.concatenate(ends) - t0 if ends else np.zeros(0), tokens=tokens,
        scheduled_time=scheduled)


def _record_per_request(done: list[tuple[int, float, ClientTrace]], isl: list[int],
                        scheduled: npt.NDArray[np.float64] | None, t0: float, drafting: bool
                        ) -> list[RequestRecord]:
    records: list[RequestRecord | None] = [None] * len(isl)
    for i, t_send, trace in done:
        times = trace.times
        output_tokens, tokens = record_tokens(trace.tokens if drafting else None, len(times))
        records[i] = RequestRecord(
            send_time=t_send - t0, end_time=float(times[-1]) - t0,
            input_tokens=isl[i], output_tokens=output_tokens,
            success=True, chunk_times=times - t0, chunk_tokens=tokens,
            scheduled_time=None if scheduled is None else float(scheduled[i]))
    return [r for r in records if r is not None]


def deployment_metrics(cluster: Cluster, before: dict[str, EngineCounters],
                       after: dict[str, EngineCounters]) -> dict[str, JSONValue]:
    """What scrapes of every role's counters before and after the point would say: the
    deployment's totals as one server's keys, and each role's under its name."""
    dep = cluster.deployment
    serving = "decode" if dep.disaggregated else "aggregated"
    first = "prefill" if dep.disaggregated else "aggregated"
    a, b = after[serving], before[serving]
    out: dict[str, JSONValue] = {
        "source": ENGINE_COUNTERS,
        "deployment": dep.topology,
        "prompt_tokens": after[first].prompt_tokens - before[first].prompt_tokens,
        "generation_tokens": a.generation_tokens - b.generation_tokens,
        "preemptions": sum(after[r].preemptions - before[r].preemptions for r in after),
        "engine_steps": sum(after[r].steps - before[r].steps for r in after),
        "max_kv_cache_usage": max(after[r].peak_kv_cache_usage for r in after),
        "max_num_requests_waiting": max(after[r].peak_num_requests_waiting for r in after),
        "kv_cache_capacity_tokens": sum(inst.engine.kv_capacity_tokens
                                        for inst in cluster.instances if inst.role == serving),
    }
    if cluster.transfer is not None:
        out["kv_transfer_fabric"] = cluster.transfer.fabric
    for role in after:
        out[role] = {"workers": sum(1 for inst in cluster.instances if inst.role == role),
                     **counter_deltas(before[role], after[role])}
    drafts = a.spec_num_drafts - b.spec_num_drafts
    if drafts:
        accepted = a.spec_num_accepted_tokens - b.spec_num_accepted_tokens
        k = cluster.pools[-1][0].engine.k
        out.update({
            "spec_num_drafts": drafts,
            "spec_num_draft_tokens": a.spec_num_draft_tokens - b.spec_num_draft_tokens,
            "spec_num_accepted_tokens": accepted,
            "spec_accepted_histogram": [x - y for x, y in zip(
                a.spec_accepted_histogram, b.spec_accepted_histogram, strict=True)],
            "acceptance_length": 1.0 + accepted / drafts,
            "acceptance_rate": accepted / (drafts * k),
        })
    return out
