"""A pipeline-parallel worker's step: `pp` stages of tp GPUs, micro-batches in flight.

docs/simulator.md, "Pipeline parallelism". No I/O, no clock: part of the engine core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy.typing as npt

    from .catalog import Hardware

    FloatArray = npt.NDArray[np.float64]

ACTIVATION_BYTES = 2.0  # hidden states are bf16 between layers and between pipeline stages
# The per-step sums `StepCost.step` takes, in its order: which hold sequences and tokens.
DECODE_SEQS, PREFILL_TOKENS, PREFILL_SEQS = 0, 3, 4


@dataclass(frozen=True)
class Pipeline:
    """`stages` stages; between consecutive ones a micro-batch's hidden states go point to
    point (one small-message latency, then bytes over the link)."""

    stages: int
    hidden: int
    send_latency_s: float
    send_bytes_per_s: float

    @classmethod
    def on(cls, hw: Hardware, *, tp: int, pp: int, hidden: int) -> Pipeline | None:
        """None without pipeline parallelism (pp 1)."""
        if pp == 1:
            return None
        # Stages of one scale-up domain send over its fabric, else over the NIC (a tp8 x pp2
        # worker on 8-GPU nodes: one stage per node).
        link = hw.link_bytes_per_s if tp * pp <= hw.scaleup_gpus else hw.nic_bytes_per_s
        return cls(stages=pp, hidden=hidden, send_latency_s=hw.collective_latency_s(2),
                   send_bytes_per_s=link)

    def step(self, one_pass: Callable[..., FloatArray | float], k: int,
             terms: tuple[FloatArray | float, ...]) -> FloatArray | float:
        """One engine step, given `one_pass` (the whole model's forward on tp GPUs over some
        per-step sums, with its overhead) and the step's sums `terms` (`StepCost.step`'s).

        The step's sequences run as m = min(pp, sequences) micro-batches in flight at once
        (vLLM V1 keeps pp batches in flight), each a 1/m share of every sum. The stages split
        the layers evenly, so the stages of one micro-batch together cost what the whole model
        on tp GPUs costs for it: that is one micro-batch's latency, the sum over the stages,
        plus pp - 1 sends of its hidden states. In the same time each stage works through
        every micro-batch once (m x one stage's 1/pp share <= that latency), so it is also the
        period in which every sequence of the step advances once."""
        micro = np.clip(np.add(terms[DECODE_SEQS], terms[PREFILL_SEQS]), 1.0, float(self.stages))
        share = [np.divide(t, micro) for t in terms]
        # Every decode sequence runs k + 1 tokens under speculative decoding.
        tokens = share[DECODE_SEQS] * (k + 1) + share[PREFILL_TOKENS]
        send = (self.send_latency_s
                + tokens * self.hidden * ACTIVATION_BYTES / self.send_bytes_per_s)
        t = one_pass(*share) + (self.stages - 1) * send
        return float(t) if np.ndim(t) == 0 else np.asarray(t, dtype=np.float64)
