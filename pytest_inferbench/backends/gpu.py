"""GPU ids and the docker run keyword arguments that expose them, per runner vendor.

Decision: a GPU preset is applied to a container only when the vendor's device nodes exist
on this host (`/dev/kfd` for ROCm, `/dev/nvidiactl` for NVIDIA) or when `--inferbench-gpus`
names GPU ids explicitly. On a machine without GPUs (CI, laptops) containers therefore start
with no device options, which is what lets the docker backend be tested against the
simulator. The vendor comes from the node's hardware
(MI* -> ROCm, everything else -> NVIDIA), not from what the host happens to have.

GPU ids of a node are a slice of its worker's GPUs: `--inferbench-gpus 0-7` is split evenly
between xdist workers (`plugin/xdist_hooks.py`), and a node takes the first `tp` ids of its worker's
slice (under `--dist loadscope` a worker runs one node at a time).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from docker.types import Ulimit

ROCM_DEVICE = Path("/dev/kfd")
NVIDIA_DEVICE = Path("/dev/nvidiactl")


class GpuSpecError(ValueError):
    """A GPU id list that cannot be parsed or does not fit the node."""


def parse_gpu_ids(text: str) -> tuple[int, ...]:
    """`"0-3,6"` -> (0, 1, 2, 3, 6); order kept, duplicates rejected."""
    ids: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        low, sep, high = part.partition("-")
        try:
            first, last = (int(low), int(high)) if sep else (int(part), int(part))
        except ValueError:
            raise GpuSpecError(f"GPU ids {text!r}: {part!r} is not N or N-M") from None
        if first < 0 or last < first:
            raise GpuSpecError(f"GPU ids {text!r}: bad range {part!r}")
        ids.extend(range(first, last + 1))
    if len(set(ids)) != len(ids):
        raise GpuSpecError(f"GPU ids {text!r}: an id appears twice")
    return tuple(ids)


def format_gpu_ids(ids: tuple[int, ...]) -> str:
    return ",".join(str(i) for i in ids)


def split_between_workers(ids: tuple[int, ...], workers: int) -> list[tuple[int, ...]]:
    """Disjoint equal slices, one per worker; the remainder stays unused rather than uneven."""
    if workers < 1:
        raise GpuSpecError("need at least one worker")
    per_worker = len(ids) // workers
    if per_worker == 0:
        raise GpuSpecError(f"{len(ids)} GPU(s) cannot be split between {workers} workers")
    return [ids[i * per_worker:(i + 1) * per_worker] for i in range(workers)]


def node_gpu_ids(worker_ids: tuple[int, ...], count: int, node: str) -> tuple[int, ...]:
    if count > len(worker_ids):
        raise GpuSpecError(
            f"{node} needs {count} GPU(s) but this worker has {len(worker_ids)} "
            f"({format_gpu_ids(worker_ids) or 'none'}); give more ids to --inferbench-gpus "
            "or run fewer xdist workers")
    return worker_ids[:count]


def vendor_for_hardware(hardware: str) -> str:
    return "rocm" if hardware.upper().startswith("MI") else "nvidia"


def vendor_devices_present(vendor: str) -> bool:
    return (ROCM_DEVICE if vendor == "rocm" else NVIDIA_DEVICE).exists()


@dataclass(frozen=True)
class GpuPreset:
    """How a container sees its GPUs: `docker_kwargs()` goes straight into containers.run."""

    vendor: str
    gpu_ids: tuple[int, ...]
    shm_size: str = "64g"

    def docker_kwargs(self) -> dict[str, object]:
        common: dict[str, object] = {
            "ipc_mode": "host",
            "shm_size": self.shm_size,
            "ulimits": _ulimits(),
            "security_opt": ["seccomp=unconfined"],
            "cap_add": ["SYS_PTRACE"],
        }
        if self.vendor == "rocm":
            visible = format_gpu_ids(self.gpu_ids)
            return {
                **common,
                "devices": ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"],
                "group_add": ["video", "render"],
                # /dev/dri exposes every card; the visibility variable is what restricts a node.
                "environment": {"HIP_VISIBLE_DEVICES": visible, "ROCR_VISIBLE_DEVICES": visible},
            }
        import docker.types

        return {
            **common,
            "device_requests": [docker.types.DeviceRequest(
                device_ids=[str(i) for i in self.gpu_ids], capabilities=[["gpu"]])],
        }


def _ulimits() -> list[Ulimit]:
    import docker.types

    return [docker.types.Ulimit(name="memlock", soft=-1, hard=-1),
            docker.types.Ulimit(name="stack", soft=67108864, hard=67108864)]


def preset_for_node(hardware: str, count: int, worker_gpus: str | None, node: str,
                    devices_present: bool | None = None) -> GpuPreset | None:
    """The preset for one node, or None when no GPUs are to be exposed (see module docstring)."""
    vendor = vendor_for_hardware(hardware)
    present = vendor_devices_present(vendor) if devices_present is None else devices_present
    if worker_gpus is None and not present:
        return None
    ids = parse_gpu_ids(worker_gpus) if worker_gpus is not None else tuple(range(count))
    return GpuPreset(vendor, node_gpu_ids(ids, count, node))
