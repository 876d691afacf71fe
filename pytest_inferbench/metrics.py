"""Per-request records and the formulas that turn them into benchmark metrics.

One module for every backend: the HTTP client and the simulator's virtual-time driver both
produce `RequestRecord`s, and `summarize()` computes the vLLM `benchmark_serving` keys from them.
(The summarize implementation lands with the load-generator work.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def _empty_float() -> FloatArray:
    return np.zeros(0, dtype=np.float64)


def _empty_int() -> IntArray:
    return np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class RequestRecord:
    """What one request did, on one clock (seconds; any origin, the same for all records).

    `chunk_times[i]` is the arrival time of the i-th streamed chunk that carried content
    (the first is the first token) and `chunk_tokens[i]` the number of tokens it carried
    (more than one under speculative decoding). `output_tokens` is the server's own count
    (usage.completion_tokens); the sum of `chunk_tokens` is the client's cross-check.
    """

    send_time: float
    end_time: float
    input_tokens: int
    output_tokens: int
    success: bool
    chunk_times: FloatArray = field(default_factory=_empty_float)
    chunk_tokens: IntArray = field(default_factory=_empty_int)
    error: str = ""

    @property
    def first_token_time(self) -> float | None:
        return float(self.chunk_times[0]) if len(self.chunk_times) else None
