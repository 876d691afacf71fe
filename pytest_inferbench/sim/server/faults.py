"""Fault injection for reliability tests of the client and the server lifecycle.

Each mode has one observable behaviour:

* ``--startup-delay S``: ``/health`` (and every API route) answers 503 for S seconds after
  start, then 200 -- a server loading its weights.
* ``--never-ready``: 503 forever -- a server that never finishes loading.
* ``--error-rate R``: each completion request fails, with probability R, with an HTTP 500
  and an OpenAI-style error body.
* ``--truncate-rate R``: each streamed completion is, with probability R, cut after half of
  its tokens: the body ends without a usage chunk and without ``data: [DONE]``.
* ``--stall-after-tokens N``: every streamed completion stops sending after N tokens and
  keeps the connection open (until the client gives up).
* ``--fail-after-requests N``: the process exits (code `FAULT_EXIT_CODE`) once N completion
  requests have finished, cutting whatever else is in flight -- a crash mid-sweep.

Random draws are seeded per request (seed, arrival number), so a run is reproducible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FAULT_EXIT_CODE = 3


@dataclass(frozen=True)
class FaultConfig:
    fail_after_requests: int | None = None
    error_rate: float = 0.0
    truncate_rate: float = 0.0
    never_ready: bool = False
    startup_delay_s: float = 0.0
    stall_after_tokens: int | None = None

    def problems(self) -> list[str]:
        """What is wrong with these settings (empty when valid)."""
        found = []
        rates = (("--error-rate", self.error_rate), ("--truncate-rate", self.truncate_rate))
        for name, rate in rates:
            if not 0.0 <= rate <= 1.0:
                found.append(f"{name} {rate}: expected a probability within [0, 1]")
        if self.fail_after_requests is not None and self.fail_after_requests < 1:
            found.append(f"--fail-after-requests {self.fail_after_requests}: expected >= 1")
        if self.stall_after_tokens is not None and self.stall_after_tokens < 0:
            found.append(f"--stall-after-tokens {self.stall_after_tokens}: expected >= 0")
        if self.startup_delay_s < 0:
            found.append(f"--startup-delay {self.startup_delay_s}: expected >= 0 seconds")
        return found

    @property
    def active(self) -> tuple[str, ...]:
        """Names of the modes that are on, for the start-up banner."""
        on = []
        if self.fail_after_requests is not None:
            on.append(f"fail-after-requests={self.fail_after_requests}")
        if self.error_rate:
            on.append(f"error-rate={self.error_rate}")
        if self.truncate_rate:
            on.append(f"truncate-rate={self.truncate_rate}")
        if self.never_ready:
            on.append("never-ready")
        if self.startup_delay_s:
            on.append(f"startup-delay={self.startup_delay_s}s")
        if self.stall_after_tokens is not None:
            on.append(f"stall-after-tokens={self.stall_after_tokens}")
        return tuple(on)


@dataclass(frozen=True)
class RequestFaults:
    """What happens to one request."""

    error: bool = False
    truncate_after_tokens: int | None = None  # end the stream after this many tokens
    stall_after_tokens: int | None = None  # stop sending after this many tokens


class FaultInjector:
    """Decides the faults of each request and tracks readiness and the crash countdown."""

    def __init__(self, config: FaultConfig, seed: int, started_at: float) -> None:
        self.config = config
        self._seed = seed
        self._ready_at = started_at + config.startup_delay_s
        self._finished = 0

    def is_ready(self, now: float) -> bool:
        return not self.config.never_ready and now >= self._ready_at

    def not_ready_reason(self, now: float) -> str:
        if self.config.never_ready:
            return "simulated server is loading and will never become ready (--never-ready)"
        return f"simulated server is loading its weights ({self._ready_at - now:.1f} s left)"

    def for_request(self, arrival_number: int, planned_tokens: int, stream: bool) -> RequestFaults:
        rng = random.Random(f"{self._seed}:{arrival_number}")
        error = rng.random() < self.config.error_rate
        truncate = rng.random() < self.config.truncate_rate
        if error:
            return RequestFaults(error=True)
        if not stream:
            return RequestFaults()
        truncate_after = planned_tokens // 2 if truncate else None
        return RequestFaults(
            truncate_after_tokens=truncate_after,
            stall_after_tokens=self.config.stall_after_tokens,
        )

    def request_finished(self) -> bool:
        """Count one finished request; True when the process must now exit."""
        self._finished += 1
        limit = self.config.fail_after_requests
        return limit is not None and self._finished >= limit
