"""A simulated point's GPU power: what each GPU draws on average over the point, from its
board's idle and rated power (`catalog/power.yaml`, each figure with its source) and what the
engine's steps did.

Each step draws idle power plus a share of the dynamic range (rated - idle): its tensor-core
time at the share 1, the rest of the step (kernels waiting on HBM, communication, launch
overhead) at `memory_bound_share`; between steps (an open loop's idle engine) the GPU draws
idle power. A step's tensor-core time is its GEMM FLOPs over the chip's achievable FLOP rate,
the compute side of the roofline the engine prices it with (`physics.StepCost`), and is never
longer than the step. Weighted by duration the per-step powers sum up, so the point's mean
needs only the point's sums: the steps' total duration (the busy time) and the tokens they ran
through the GEMMs, which the engine's counters give. docs/simulator.md says what is left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from ..util.yamllines import load_data
from .catalog import CatalogError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..results.record import JSONValue
    from .physics import StepCost

CATALOG_FILE = "power.yaml"
# The simulated HTTP server's power on /metrics (`sim/server/energy.py`), which a client reads
# back over a point's measured phase (`backends/measured.py`): the joules each GPU drew by this
# model, and the seconds of the model's clock they cover (Prometheus adds `_total`).
ENERGY_COUNTER = "inferbench:simulated_gpu_energy_joules"
SECONDS_COUNTER = "inferbench:simulated_seconds"


@dataclass(frozen=True)
class GpuPower:
    """One board's power figures, per GPU, with where each comes from."""

    name: str
    tdp_w: float
    idle_w: float
    tdp_source: str
    idle_source: str


@cache
def _table() -> dict[str, Any]:
    folder = resources.files("pytest_inferbench.sim").joinpath("catalog")
    text = folder.joinpath(CATALOG_FILE).read_text()
    data = load_data(text)
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), dict):
        raise CatalogError(f"catalog/{CATALOG_FILE}: expected a mapping with `gpus`")
    return data


@cache
def gpu_power(hardware: str) -> GpuPower:
    """The power figures of a catalog GPU (names as `catalog.hardware` takes them)."""
    table: dict[str, Any] = _table()["gpus"]
    key = next((name for name in table if name.lower() == hardware.lower()), None)
    if key is None:
        raise CatalogError(f"no power figures for GPU {hardware!r} in catalog/{CATALOG_FILE}; "
                           f"known: {', '.join(sorted(table))}")
    entry = table[key]
    return GpuPower(key, float(entry["tdp_w"]), float(entry["idle_w"]),
                    str(entry["tdp_source"]), str(entry["idle_source"]))


def memory_bound_share() -> float:
    return float(_table()["memory_bound_share"])


@dataclass(frozen=True)
class StepWork:
    """What a point's steps did, per GPU: their total duration and tensor-core time."""

    busy_s: float
    compute_s: float


def step_work(cost: StepCost, busy_s: float, counters: Mapping[str, JSONValue]) -> StepWork:
    """The steps' tensor-core time from the point's counter deltas (`driver.server_metrics`):
    the prompt tokens the engine computed (prefix-cache hits are not), the decode tokens (under
    speculative decoding every verify runs k+1 tokens through the target and the draft runs
    about 2k: its first forward over the k+1 verified positions, then k-1 of one token)."""
    def count(key: str) -> float:
        value = counters.get(key, 0)
        return float(value) if isinstance(value, (int, float)) else 0.0

    prefill = max(count("prompt_tokens") - count("prefix_cache_hits"), 0.0)
    k = cost.k
    if k and cost.draft is not None:
        verifies = count("spec_num_drafts")
        target_tokens = prefill + verifies * (k + 1)
        draft_s = verifies * 2 * k * cost.draft.linear_s_per_token
    else:
        target_tokens = prefill + count("generation_tokens")
        draft_s = 0.0
    compute = (target_tokens * cost.target.linear_s_per_token + draft_s) / cost.eta_flops
    return StepWork(busy_s=busy_s, compute_s=min(compute, busy_s))


def mean_power_w(gpu: GpuPower, work: StepWork, duration_s: float,
                 memory_share: float | None = None) -> float:
    """Each GPU's mean power over a point of `duration_s` whose steps did `work`."""
    share = memory_bound_share() if memory_share is None else memory_share
    if duration_s <= 0:
        return gpu.idle_w
    busy = min(work.busy_s, duration_s)
    compute = min(work.compute_s, busy)
    active = compute + share * (busy - compute)  # seconds at the full dynamic range
    return gpu.idle_w + (gpu.tdp_w - gpu.idle_w) * active / duration_s


def energy_j(gpu: GpuPower, work: StepWork, duration_s: float) -> float:
    """The joules each GPU draws over `duration_s` whose steps did `work`."""
    return mean_power_w(gpu, work, duration_s) * duration_s if duration_s > 0 else 0.0
