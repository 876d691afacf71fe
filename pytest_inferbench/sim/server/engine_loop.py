"""One background asyncio task that runs the simulated engine on the server's clock.

The engine core has no clock: `step()` says how long the step takes and who got tokens. The
loop calls `step()` at the step's start, sleeps until the step's end on the server clock
(absolute targets scaled by `time_scale`, so lateness never accumulates; at 0 it only yields),
then hands each request its tokens as one delivery -- an EAGLE3 step that accepts three tokens
delivers three tokens at once, as real engines do. Requests that arrive while a step runs are
added to the engine right away and join the next step, like a real scheduler.
"""

from __future__ import annotations

import asyncio
import math
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ...loadgen.replay_prompts import play_of
from ...util.aio import cancel_and_wait
from ..prefix_cache import block_hashes
from .timeline import DEFAULT_BUDGET_MIB, MIB, Timeline

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..state import EngineCounters, StepResult
    from .timeline import RequestTrace

# Before arming a step's timer the loop yields until a round of the event loop runs (almost)
# nothing but itself: see `_settle`.
SETTLED_ROUND_S = 0.0002
MAX_SETTLE_ROUNDS = 8


class EngineLike(Protocol):
    """What the server drives (`sim.engine.Engine`, or a deployment's `sim.cluster.Cluster`)."""

    @property
    def k(self) -> int:  # draft tokens per verify step (0: no speculative decoding)
        ...

    @property
    def prefix_block_size(self) -> int:  # block size of `block_hashes` (0: no prefix cache)
        ...

    def add_request(self, request_id: int, prompt_tokens: int, max_tokens: int, *,
                    block_hashes: tuple[int, ...] = (), session: object = None) -> None: ...
    def abort_request(self, request_id: int) -> None: ...
    def has_work(self) -> bool: ...
    def step(self) -> StepResult: ...
    def counters(self) -> EngineCounters: ...


@dataclass(frozen=True)
class Delivery:
    """Tokens of one engine step for one request; `step_end` is the model's time for them."""

    tokens: int
    step_end: float
    finished: bool


@dataclass
class LoopLag:
    """How far step deliveries fell behind the model's timeline (a self-check of the server:
    a busy machine makes the served timing slower than the model predicts)."""

    steps: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    over_5ms: int = 0

    def note(self, lag_s: float) -> None:
        lag_s = max(lag_s, 0.0)
        self.steps += 1
        self.total_s += lag_s
        self.max_s = max(self.max_s, lag_s)
        self.over_5ms += lag_s > 0.005

    def as_json(self) -> dict[str, float | int]:
        return {"steps": self.steps, "mean_s": self.total_s / self.steps if self.steps else 0.0,
                "max_s": self.max_s, "steps_over_5ms": self.over_5ms}


class EngineLoop:
    """Owns the engine, the step task, and each request's delivery queue."""

    def __init__(self, engine: EngineLike, time_scale: float,
                 clock: Callable[[], float] = time.monotonic,
                 timeline_bytes: int = int(DEFAULT_BUDGET_MIB * MIB)) -> None:
        # inf would never end a step and nan never compares: neither is a time scale.
        if not (math.isfinite(time_scale) and time_scale >= 0):
            raise ValueError(f"time scale must be a finite number >= 0, got {time_scale}")
        self.engine = engine
        self.time_scale = time_scale
        self.clock = clock
        self._queues: dict[int, asyncio.Queue[Delivery]] = {}
        self._awaiting_first: set[int] = set()  # requests that have had no token yet
        self._last_submit = -math.inf  # server clock of the latest submission
        self._wake = asyncio.Event()
        self._next_id = 0
        self._task: asyncio.Task[None] | None = None
        self.steps = 0
        # The model's clock: the seconds of the steps that ran, and of the waits for work
        # between them (on the server clock over the time scale; a late step's lag is the
        # machine's, not the model's, and counts in neither).
        self.busy_s = 0.0
        self.idle_s = 0.0
        self._idle_since: float | None = None  # server clock the current wait began at
        self.timeline = Timeline(timeline_bytes)
        self.failure: BaseException | None = None
        self.closing = asyncio.Event()  # set at shutdown: open streams end, stalls let go
        self.lag = LoopLag()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def submit(self, prompt_tokens: int, max_tokens: int, prompt_text: str = ""
               ) -> tuple[int, asyncio.Queue[Delivery]]:
        """Add a request; its tokens arrive on the returned queue. The prompt's text gives
        its blocks' content hashes to an engine with a prefix cache, and its replay marker
        the session a deployment keeps on the instances of its first request."""
        request_id = self._next_id
        self._next_id += 1
        queue: asyncio.Queue[Delivery] = asyncio.Queue()
        block = self.engine.prefix_block_size
        hashes = block_hashes(prompt_text.split(), block) if block and prompt_text else ()
        self.engine.add_request(request_id, prompt_tokens, max_tokens, block_hashes=hashes,
                                session=play_of(prompt_text))
        self._queues[request_id] = queue
        self._awaiting_first.add(request_id)
        self._last_submit = self.clock()
        self._wake.set()
        return request_id, queue

    def abort(self, request_id: int) -> None:
        """Stop generating for a request (client gone, stream cut); idempotent."""
        self._awaiting_first.discard(request_id)
        if self._queues.pop(request_id, None) is not None:
            self.engine.abort_request(request_id)

    def close_streams(self) -> None:
        """Server shutdown: release every waiting request so connections can close."""
        if self.closing.is_set():
            return
        self.closing.set()
        self._release_all()

    def _release_all(self) -> None:
        now = self.clock()
        for queue in self._queues.values():
            queue.put_nowait(Delivery(0, now, True))
        self._queues.clear()
        self._awaiting_first.clear()

    def model_seconds(self) -> float:
        """The model's clock since the loop started: its steps' seconds and its waits for work
        (at time scale 0, which keeps no clock, only the steps')."""
        waiting = 0.0
        if self._idle_since is not None and self.time_scale > 0:
            waiting = max(self.clock() - self._idle_since, 0.0) / self.time_scale
        return self.busy_s + self.idle_s + waiting

    @property
    def interrupted(self) -> bool:
        """The engine failed or the server is shutting down: no more tokens will come."""
        return self.failure is not None or self.closing.is_set()

    def record(self, trace: RequestTrace) -> None:
        self.timeline.append(trace)

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # reported on /health; waiting requests are released
            self.failure = exc
            traceback.print_exc()
            self._release_all()
            raise

    async def _loop(self) -> None:
        step_start = self.clock()
        while True:
            waited = not self.engine.has_work()
            if waited:
                self._wake.clear()
                # The wait begins when the last step ended, or now if its delivery was late.
                idle_from = self._idle_since = max(step_start, self.clock())
                await self._wake.wait()
                self._idle_since = None
                # An idle engine starts its next step when work arrives, not in the past.
                step_start = max(step_start, self.clock())
            # A step never starts before a request it may schedule arrived: when deliveries fall
            # behind the model (an overloaded machine), a new request joins a step that starts
            # on its arrival, not one whose planned start has already passed.
            step_start = max(step_start, self._last_submit)
            if waited and self.time_scale > 0:
                self.idle_s += max(step_start - idle_from, 0.0) / self.time_scale
            result = self.engine.step()
            self.steps += 1
            step_end = step_start + float(result.duration_s) * self.time_scale
            if self.time_scale > 0:
                await self._sleep_until(step_end)
            else:
                await asyncio.sleep(0)
                step_end = self.clock()
            self.lag.note(self.clock() - step_end)
            self.busy_s += float(result.duration_s)
            self._deliver(result, step_end)
            step_start = step_end

    async def _sleep_until(self, target: float) -> None:
        """Sleep until the clock reads `target` or later, yielding at least once.

        A timer may fire before its deadline (uvloop's libuv timers count whole milliseconds),
        and tokens sent before the model's time would make the server faster than the model;
        so the loop sleeps again for whatever is left rather than trusting one wake-up. The
        timer is armed only once the step's deliveries have been written (`_settle`).
        """
        await _settle()
        delay = target - self.clock()
        while delay > 0:
            await asyncio.sleep(delay)
            delay = target - self.clock()

    def _deliver(self, result: StepResult, step_end: float) -> None:
        """Hand each request its tokens of the step: first and last tokens first.

        The model emits every token of a step at its end; one Python process then sends them
        one after another, so a step's last chunk leaves a few milliseconds after its first (at
        conc 256, hundreds of chunks). A request's first and last chunks go first: TTFT and
        E2EL are each one stamp and would take that delay whole, and TPOT is their difference,
        so both ends are kept alike (sending only first tokens early biased TPOT of short
        outputs up); the chunks in between share the delay and their gaps average it out.
        """
        finished = set(result.finished)
        later: list[tuple[int, Delivery]] = []  # neither a first nor a last chunk
        for request_id, tokens in result.emitted:
            if request_id in self._awaiting_first or request_id in finished:
                self._awaiting_first.discard(request_id)
                self._put(request_id, Delivery(int(tokens), step_end, request_id in finished))
            else:
                later.append((request_id, Delivery(int(tokens), step_end, False)))
        for request_id, delivery in later:
            self._put(request_id, delivery)
        emitted = {request_id for request_id, _ in result.emitted}
        for request_id in finished:
            self._awaiting_first.discard(request_id)
            queue = self._queues.pop(request_id, None)
            if queue is not None and request_id not in emitted:
                queue.put_nowait(Delivery(0, step_end, True))

    def _put(self, request_id: int, delivery: Delivery) -> None:
        queue = self._queues.get(request_id)
        if queue is not None:
            queue.put_nowait(delivery)


async def _settle() -> None:
    """Yield until the callbacks queued ahead (a step's deliveries: one stream write each) ran.

    libuv computes its poll timeout from the loop time cached when the iteration began, so a
    timer armed before a burst of callbacks in the same iteration fires late by the burst's
    length: under uvloop at conc 64 (ATOM MiniMax-M3 EAGLE3, 1k/1k) engine wake-ups were 5.4 ms
    late on average and a step's first chunk 6.8 ms (median). Armed from a round that ran
    nothing else, the timer fires on time: 0.65 ms on average, 1.7 ms for the first chunk.
    """
    for _ in range(MAX_SETTLE_ROUNDS):
        began = time.perf_counter()
        await asyncio.sleep(0)
        if time.perf_counter() - began < SETTLED_ROUND_S:
            return
