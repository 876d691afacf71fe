"""What the roofline cannot derive: the efficiency knobs (a framework profile's or a
calibration's) and the fixed host-side cost of a step with and without CUDA/HIP graphs.
Equations and sources: docs/simulator.md, "Step time"."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from . import calibration
from .catalog import Framework, Hardware, checkpoint

# Host time per decoder layer that a step pays on top when its forward runs eagerly (each
# kernel launched from Python) instead of as one CUDA/HIP graph. Published batch-1 decode with
# and without graphs: vllm PR #1440, Llama-2-7B on one GPU, 100 tokens in 1.2 s eager and
# 1.05 s with graphs (1.5 ms a token over 32 layers: 47 us a layer); xLLM PR #713,
# Qwen3-0.6B at concurrency 1, TPOT 4.20 ms eager and 2.72 ms with graphs (53 us a layer over
# 28 layers).
EAGER_S_PER_LAYER = 50e-6


@dataclass(frozen=True)
class Efficiency:
    """The named knobs a calibration fits (`sim/calibrate/`): what the roofline cannot derive
    and a framework's profile otherwise gives.

    - step_overhead_s: fixed cost of every engine step (launches, scheduling, sampling)
    - hbm_efficiency: achieved fraction of the chip's peak HBM bandwidth
    - compute_efficiency: achieved fraction of the chip's dense peak FLOP/s (this chip's own,
      not rescaled by `achievable_flops` as a profile's is)
    """

    step_overhead_s: float
    hbm_efficiency: float
    compute_efficiency: float


def profile_efficiency(hw: Hardware, fw: Framework, layers: int) -> Efficiency:
    """The knobs as the framework's profile sets them on this chip for a model of `layers`
    decoder layers (no calibration)."""
    # The framework's compute efficiency was fitted on one chip; scale it by how much of its
    # peak each chip realizes relative to that one. Its step overhead was fitted on one model:
    # under CUDA/HIP graphs what remains of it is paid per kernel boundary, so it scales with
    # the layers a forward runs (as a draft forward's share is priced in `physics.StepCost`).
    return Efficiency(
        step_overhead_s=fw.step_overhead_s * layers / overhead_layers(),
        hbm_efficiency=fw.hbm_efficiency,
        compute_efficiency=fw.compute_efficiency * hw.achievable_flops
        / fw.calibration_achievable_flops)


def eager_overhead_s(layers: int) -> float:
    """What a step of a `layers`-layer forward pays on top without CUDA/HIP graphs (vLLM and
    ATOM `--enforce-eager`, SGLang `--disable-cuda-graph`); the profiles' overheads were fitted
    with graphs."""
    return EAGER_S_PER_LAYER * layers


@cache
def overhead_layers() -> int:
    """Decoder layers of the model the profiles' step overheads were fitted on: the
    calibration set's (MiniMax-M3, 60; `sim/calibration.py`)."""
    return checkpoint(calibration.MODEL).architecture.layers


__all__ = ["EAGER_S_PER_LAYER", "Efficiency", "eager_overhead_s", "overhead_layers",
           "profile_efficiency"]
