"""What the server keeps about finished requests for `/debug/inferbench/timeline`.

Each streamed chunk adds a send time and a planned time to its request's record, so a long
run at high concurrency would otherwise hold every token it ever sent. The store is bounded
twice: by a memory budget (estimated bytes of the kept records) and by a count of records;
past either, the oldest records go first, and the endpoint reports how many went.
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, field

MAX_RECORDS = 100_000  # finished requests kept, whatever their size
DEFAULT_BUDGET_MIB = 256.0  # memory for the kept records (--timeline-mib)
MIB = 1 << 20
_SLOT = 8  # one list slot: a pointer
# One emission: its (send time, tokens) pair and the planned time, each behind a list slot
# (token counts are small ints, which Python shares).
EMISSION_BYTES = sys.getsizeof((0.0, 0)) + 2 * sys.getsizeof(0.0) + 2 * _SLOT


@dataclass
class RequestTrace:
    """Server-side truth about one request, on the server's monotonic clock."""

    request_id: int
    response_id: str
    arrival: float
    prompt_tokens: int
    max_tokens: int
    emissions: list[tuple[float, int]] = field(default_factory=list)  # (sent at, tokens)
    planned: list[float] = field(default_factory=list)  # the model's time of each emission
    finish: float | None = None
    outcome: str = "running"  # finished | aborted | truncated | stalled | error
    # When the engine got it: after the body was read and parsed (a client that sends its body
    # late is late here, not at `arrival`, the handler's start).
    submitted: float | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.response_id, "request_id": self.request_id, "arrival": self.arrival,
            "prompt_tokens": self.prompt_tokens, "max_tokens": self.max_tokens,
            "emissions": [[t, n] for t, n in self.emissions],
            "planned": self.planned,
            "completion_tokens": sum(n for _, n in self.emissions),
            "finish": self.finish, "outcome": self.outcome, "submitted": self.submitted,
        }

    def approx_bytes(self) -> int:
        """Memory the record holds: the object, its id string, its lists and their items."""
        fixed = (sys.getsizeof(self) + sys.getsizeof(self.__dict__)
                 + sys.getsizeof(self.response_id) + 2 * sys.getsizeof([])
                 + 3 * sys.getsizeof(0.0))  # arrival, finish, submitted
        return fixed + EMISSION_BYTES * len(self.emissions)


class Timeline:
    """Finished requests in the order they finished, within a byte budget and a count."""

    def __init__(self, budget_bytes: int = int(DEFAULT_BUDGET_MIB * MIB),
                 max_records: int = MAX_RECORDS) -> None:
        if budget_bytes < 0 or max_records < 0:
            raise ValueError("a timeline budget is >= 0")
        self.budget_bytes = budget_bytes
        self.max_records = max_records
        self._records: deque[tuple[RequestTrace, int]] = deque()
        self.kept_bytes = 0
        self.dropped = 0  # records let go to stay within the budget, since the last clear

    def append(self, trace: RequestTrace) -> None:
        size = trace.approx_bytes()
        self._records.append((trace, size))
        self.kept_bytes += size
        while self._records and (self.kept_bytes > self.budget_bytes
                                 or len(self._records) > self.max_records):
            _, gone = self._records.popleft()
            self.kept_bytes -= gone
            self.dropped += 1

    def clear(self) -> None:
        self._records.clear()
        self.kept_bytes = 0
        self.dropped = 0

    def since(self, request_id: int) -> list[RequestTrace]:
        return [trace for trace, _ in self._records if trace.request_id >= request_id]

    def __len__(self) -> int:
        return len(self._records)

    def stats(self) -> dict[str, int]:
        return {"kept": len(self._records), "kept_bytes": self.kept_bytes,
                "budget_bytes": self.budget_bytes, "max_records": self.max_records,
                "dropped": self.dropped}
