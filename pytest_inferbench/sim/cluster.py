"""A multinode deployment running: engine instances per pool, the router, KV transfers.

It composes the ordinary engine (`engine.Engine`, one per worker) and keeps no clock: the
caller advances it from event to event (`advance`), and each step's virtual duration comes
from the instance that runs it, so instances run side by side, each on its own timeline.
A request arrives at the router, which picks its prefill and decode instances; the prefill
instance computes the prompt and its first token (a request of one output token there); the
KV cache then travels (`disagg.KvTransfer`) and the decode instance admits the request once it
has arrived and its blocks fit (`Engine.add_request(kv_ready=True)`): that admission step
streams the first token, then it decodes. Aggregated deployments route whole requests.

A stretch of identical decode steps (`stretch.plan`) is priced at once up to the instance's
next finish and applied only as far as it has run when a request reaches the instance (a
transfer's arrival, a request routed to it, `Instance.settle`): nothing else changes its batch,
so the token times are those of stepping every instance one step at a time.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .decode_instance import DecodeInstance
from .disagg import Deployment, Router, kv_transfer, worker_link_bytes_per_s
from .engine import Engine, RequestRejectedError
from .instance import Instance, Timeline
from .prefill_instance import PrefillInstance
from .state import EngineCounters, StepResult

if TYPE_CHECKING:
    import numpy.typing as npt

    from .disagg import Pool

# An engine-backed instance, or one of a disaggregated deployment's lean ones.
AnyInstance = Instance | PrefillInstance | DecodeInstance


# Named tuples rather than frozen dataclasses: one of each is made per event and per request.
class ClusterEvent(NamedTuple):
    """What happened at `now`: client-visible tokens (when stepping) and finished requests."""

    now: float
    emitted: list[tuple[int, int]]
    finished: list[int]


class ClientTrace(NamedTuple):
    """A finished request as its client saw it: its chunks left at the ends of `steps` on the
    `timeline` of the instance that streamed them (the cluster's clock). The step ends are
    read from that timeline, not copied per request: a point can hold hundreds of thousands
    of requests of a thousand chunks each."""

    timeline: Timeline
    steps: slice | npt.NDArray[np.int64]  # a slice where they run on without a break
    tokens: npt.NDArray[np.int64]
    first_scheduled_s: float  # when its prompt's first chunk started computing
    transfer_s: float  # its KV transfer (0 when aggregated)

    @property
    def times(self) -> npt.NDArray[np.float64]:
        """When each streamed chunk left (a copy)."""
        times: npt.NDArray[np.float64] = self.timeline.ends[self.steps]
        return times.copy() if isinstance(self.steps, slice) else times


@dataclass
class _Flight:
    prompt: int
    max_tokens: int
    prefill: int
    decode: int
    first_scheduled_s: float = math.nan
    transfer_s: float = 0.0


class Cluster:
    def __init__(self, deployment: Deployment, *, seed: int = 0, stretch: bool = True,
                 lean: bool = False) -> None:
        """`lean`: a disaggregated deployment's instances run without an engine's slot table
        (`PrefillInstance`, `DecodeInstance` from per-step sums), which raise `Declined` where
        their engine would preempt."""
        self.deployment = deployment
        self.stretch = stretch  # False: every instance one step at a time (the server's way)
        self.lean = lean
        self.transfer = kv_transfer(deployment)
        self.pools: list[list[AnyInstance]] = [
            [self._instance(pool, i, seed, lean) for i in range(pool.workers)]
            for pool in deployment.pools]
        self.instances = [inst for pool in self.pools for inst in pool]
        self.router = Router(deployment.router, deployment.prefill.workers,
                             deployment.decode.workers if deployment.decode else 0, seed)
        self.now = 0.0
        self._flights: dict[int, _Flight] = {}
        self._transfers: list[tuple[float, int]] = []  # (arrival time, request id) heap
        self._done: dict[int, ClientTrace] = {}
        self.transfer_seconds: list[float] = []
        self._sessions: dict[object, tuple[int, int]] = {}  # session -> (prefill, decode)

    def _instance(self, pool: Pool, index: int, seed: int, lean: bool
                  ) -> AnyInstance:
        engine = Engine(replace(pool.config, seed=seed + 7919 * index + 104729 * len(pool.role)),
                        keep_traces=True)
        engine.report_emitted = not self.stretch
        link = worker_link_bytes_per_s(pool.config)
        if link != engine.cost.link_bytes_per_s:  # a worker wider than its scale-up domain
            engine.cost = replace(engine.cost, link_bytes_per_s=link)
        if lean and pool.role == "decode":
            return DecodeInstance(index, engine)
        if lean and pool.role == "prefill":
            return PrefillInstance(index, engine)
        return Instance(pool.role, index, engine)

    # ----------------------------------------------------------------- requests
    @property
    def prefix_block_size(self) -> int:
        """The block size of `block_hashes` (0: the instances keep no prefix cache)."""
        first = self.pools[0][0].engine  # where prompts are computed and cached
        return first.block_size if not self.lean and first.prefix_cache is not None else 0

    def add_request(self, request_id: int, prompt_tokens: int, max_tokens: int, *,
                    block_hashes: tuple[int, ...] = (), session: object = None) -> None:
        """A request reaches the router now; RequestRejectedError if it can never run.
        `block_hashes`: its prompt's blocks for the prefix cache of the instance that computes
        the prompt (engine-backed instances only); `session`: the requests of one session go
        to the instances its first request was routed to (the session affinity of
        InferenceX's agentic deployments: Dynamo's conversation-aware routing, a router's
        consistent hash on the session header)."""
        if request_id in self._flights:
            raise ValueError(f"request id {request_id} is already in the cluster")
        if block_hashes and self.lean:
            raise ValueError("lean instances keep no prefix cache: give block hashes to "
                             "engine-backed instances (Cluster(lean=False))")
        if session is None:
            # Outside a session the router scatters a conversation's turns, and the fixed-length
            # deployment in process (`cluster_driver`) prices no cache: a request of no session
            # is priced uncached, so the served deployment agrees with it.
            block_hashes = ()
        prefill_pool = self.pools[0]
        bound = self._sessions.get(session) if session is not None else None
        if bound is not None:
            p, d = bound
        else:
            p = self.router.pick(0, [inst.load for inst in prefill_pool])
            d = (self.router.pick(1, [inst.load for inst in self.pools[1]])
                 if len(self.pools) > 1 else -1)
        if len(self.pools) > 1:
            self.check_fits(self.pools[1][d].engine, prompt_tokens, max_tokens)
            self.check_fits(prefill_pool[p].engine, prompt_tokens, 1)
            self._add(prefill_pool[p], request_id, prompt_tokens, 1, block_hashes)
            self.pools[1][d].load += 1
        else:
            self.check_fits(prefill_pool[p].engine, prompt_tokens, max_tokens)
            self._add(prefill_pool[p], request_id, prompt_tokens, max_tokens, block_hashes)
        if session is not None:
            self._sessions[session] = (p, d)
        prefill_pool[p].load += prompt_tokens if len(self.pools) > 1 else 1
        self._flights[request_id] = _Flight(prompt_tokens, max_tokens, p, d)

    def _add(self, inst: AnyInstance, request_id: int, prompt_tokens: int, max_tokens: int,
             block_hashes: tuple[int, ...]) -> None:
        if block_hashes:
            assert isinstance(inst, Instance)
            inst.add(request_id, prompt_tokens, max_tokens, self.now, block_hashes=block_hashes)
        else:
            inst.add(request_id, prompt_tokens, max_tokens, self.now)

    @staticmethod
    def check_fits(engine: Engine, prompt_tokens: int, max_tokens: int) -> None:
        cfg = engine.config
        if prompt_tokens + max_tokens > cfg.max_model_len:
            raise RequestRejectedError(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, "
                f"you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the "
                f"messages, {max_tokens} in the completion).")
        need = -(-(prompt_tokens + max_tokens + engine.k) // engine.block_size)
        if need > engine.num_blocks:
            raise RequestRejectedError(
                f"request of {prompt_tokens + max_tokens} tokens exceeds the KV cache of a "
                f"{engine.config.gpus}-GPU worker ({engine.num_blocks} blocks of "
                f"{engine.block_size} tokens)")

    def abort_request(self, request_id: int) -> None:
        if self.lean:
            raise RuntimeError("a request on lean instances runs to its end: abort it on "
                               "engine-backed instances (Cluster(lean=False))")
        flight = self._flights.pop(request_id, None)
        if flight is None:
            return
        self._transfers = [t for t in self._transfers if t[1] != request_id]
        heapq.heapify(self._transfers)
        for inst in self.instances:
            inst.deferred = [d for d in inst.deferred if d[0] != request_id]
            if isinstance(inst, Instance):
                inst.deferred_hashes.pop(request_id, None)
            if request_id in inst.engine.requests:
                inst.settle(self.now)
                inst.engine.abort_request(request_id)
        self._release(flight)

    def _release(self, flight: _Flight) -> None:
        if len(self.pools) > 1:
            self.pools[1][flight.decode].load -= 1
        else:
            self.pools[0][flight.prefill].load -= 1

    def has_work(self) -> bool:
        return bool(self._flights)

    def pop_trace(self, request_id: int) -> ClientTrace:
        return self._done.pop(request_id)

    # ----------------------------------------------------------------- running
    def advance(self, until: float = math.inf) -> ClusterEvent:
        """Run to the next event (a step's end, a transfer's arrival) or `until`, whichever
        comes first; requests added afterwards arrive at the returned `now`."""
        for inst in self.instances:
            if inst.busy_until is None and inst.has_work():
                inst.start(self.now, self.stretch)
        t = until
        for inst in self.instances:
            if inst.busy_until is not None and inst.busy_until < t:
                t = inst.busy_until
        if self._transfers and self._transfers[0][0] < t:
            t = self._transfers[0][0]
        if not math.isfinite(t):
            return ClusterEvent(self.now, [], [])
        self.now = max(self.now, t)
        emitted: list[tuple[int, int]] = []
        finished: list[int] = []
        for inst in self.instances:
            if inst.busy_until is not None and inst.busy_until <= self.now:
                inst.settle(self.now)
                inst.busy_until = None
                self._complete(inst, emitted, finished)
                inst.ended_busy = inst.has_work()
        while self._transfers and self._transfers[0][0] <= self.now:
            _, rid = heapq.heappop(self._transfers)
            flight = self._flights[rid]
            self.pools[1][flight.decode].add(rid, flight.prompt, flight.max_tokens, self.now,
                                             True)
        return ClusterEvent(self.now, emitted, finished)

    def _complete(self, inst: AnyInstance, emitted: list[tuple[int, int]],
                  finished: list[int]) -> None:
        timeline = inst.timeline
        if inst.role == "prefill" and self.transfer is not None:
            for rid in inst.finished:
                first_step = inst.token_steps(rid)[2]
                flight = self._flights[rid]
                start = float(timeline.starts[first_step])
                flight.first_scheduled_s = start
                flight.transfer_s = self.transfer.seconds(flight.prompt, self.now - start)
                self.transfer_seconds.append(flight.transfer_s)
                inst.load -= flight.prompt
                heapq.heappush(self._transfers, (self.now + flight.transfer_s, rid))
            inst.finished = []
            inst.emitted = []
            return
        emitted.extend(inst.emitted)
        inst.emitted = []
        for rid in inst.finished:
            steps, tokens, first_step = inst.token_steps(rid)
            flight = self._flights.pop(rid)
            self._release(flight)
            first = (flight.first_scheduled_s if self.transfer is not None
                     else float(timeline.starts[first_step]))
            self._done[rid] = ClientTrace(timeline, steps, tokens, first,
                                          flight.transfer_s)
            finished.append(rid)
        inst.finished = []

    def step(self) -> StepResult:
        """The engine's interface for a server's loop (`server.engine_loop`): run to the next
        event; its duration, the tokens clients get then, the requests that finished."""
        before = self.now
        event = self.advance()
        return StepResult(event.now - before, event.emitted, event.finished)

    @property
    def k(self) -> int:
        """Draft tokens per verify step of the instances that stream tokens."""
        return self.pools[-1][0].engine.k

    # ----------------------------------------------------------------- metrics
    def counters(self, role: str | None = None) -> EngineCounters:
        """The counters of every instance of a role, added up (peaks: the highest); without
        a role, the deployment's as one server's: requests and preemptions everywhere, prompt
        tokens where prompts are computed, the rest where tokens are streamed."""
        if role is None:
            per_role = [self.counters(r) for r in self.roles]
            serving = per_role[-1]
            return replace(
                serving, num_requests_running=sum(c.num_requests_running for c in per_role),
                num_requests_waiting=sum(c.num_requests_waiting for c in per_role),
                peak_num_requests_waiting=max(c.peak_num_requests_waiting for c in per_role),
                prompt_tokens=per_role[0].prompt_tokens,
                preemptions=sum(c.preemptions for c in per_role),
                steps=sum(c.steps for c in per_role))
        snaps = [inst.engine.counters() for inst in self.instances if inst.role == role]
        if not snaps:
            raise ValueError(f"no {role} instances in this deployment")
        values: dict[str, object] = {}
        for f in fields(EngineCounters):
            items = [getattr(s, f.name) for s in snaps]
            if isinstance(items[0], float):
                values[f.name] = max(items)
            elif isinstance(items[0], tuple):
                values[f.name] = tuple(int(sum(col)) for col in zip(*items, strict=True))
            else:
                values[f.name] = sum(items)
        return EngineCounters(**values)  # type: ignore[arg-type]

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(pool[0].role for pool in self.pools)

