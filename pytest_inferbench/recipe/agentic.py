"""Agentic-coding (trace replay) entries: InferenceX's rules for them, their names, their DRAM.

The rules are those of InferenceX's validator for the current schema (`kv-offloading`): an
agentic entry runs on a `cluster:<name>` runner, a single-node row says its `kv-offloading`, a
`kv-offload-backend` is given exactly when offloading is `dram` and its version is no image
reference, and a multinode row leaves `pp`/`dcp-size`/`pcp-size` to its workers. The runner rule
binds entries whose rows say `kv-offloading`/`kv-offload-backend`; the older schema (`offloading`,
plain runner names) had neither.

The DRAM budget (`total-cpu-dram-gb`) and the exp names are computed as InferenceX's matrix
generator computes them, from the runner hardware table of `runners.yaml` beside the recipe.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Protocol

import yaml

from ..util import yamllines

if TYPE_CHECKING:
    from pathlib import Path

SCENARIO = "agentic-coding"
RUNNERS_FILE = "runners.yaml"
# InferenceX caps a node's usable CPU DRAM (3 TB decimal, in MiB) before the utilization.
MAX_AVAILABLE_CPU_DRAM_MIB = 2_861_022
BYTES_PER_MIB = 1024 * 1024
BYTES_PER_GB = 1_000_000_000
# The context an agentic server is launched with: InferenceX replays traces at the model's native
# context limit, never lower. Its trace corpus follows the model prefix (`benchmark_lib.sh`
# `resolve_trace_source`): these prefixes get the full corpus (1M-context models), the others its
# `_256k` variant, whose requests all fit 256k tokens.
FULL_CORPUS_PREFIXES = ("dsv4", "glm5.2", "minimaxm3", "kimik3")
FULL_CORPUS_CONTEXT = 1_048_576
CORPUS_256K_CONTEXT = 262_144


# What these functions read of `model.ServerConfig` (which asks them for its agentic names).
class Parallelism(Protocol):
    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def pcp(self) -> int: ...


class Worker(Protocol):
    @property
    def num_worker(self) -> int: ...
    @property
    def parallel(self) -> Parallelism: ...


class ServerConfig(Protocol):
    @property
    def model_prefix(self) -> str: ...
    @property
    def runner(self) -> str: ...
    @property
    def parallel(self) -> Parallelism: ...
    @property
    def prefill(self) -> Worker | None: ...
    @property
    def decode(self) -> Worker | None: ...
    @property
    def spec_decoding(self) -> str: ...
    @property
    def offloading(self) -> str: ...
    @property
    def kv_offload_backend(self) -> str | None: ...
    @property
    def dram_utilization(self) -> float | None: ...
    @property
    def total_cpu_dram_gb(self) -> int | None: ...


@dataclass(frozen=True)
class RunnerHardware:
    """One runner label's row of `runners.yaml`'s `hardware:` table."""

    available_cpu_dram_mib: int
    gpus_per_node: int


@dataclass(frozen=True)
class RunnerTable:
    """The hardware table beside a recipe; `problem` says why it could not be read."""

    path: Path
    hardware: dict[str, RunnerHardware]
    found: bool
    problem: str | None = None


def read_runner_table(recipe: Path) -> RunnerTable:
    """`runners.yaml` beside the recipe (InferenceX's `configs/`), its `hardware:` rows."""
    path = recipe.parent / RUNNERS_FILE
    if not path.is_file():
        return RunnerTable(path=path, hardware={}, found=False)
    try:
        data = yamllines.load_data(path.read_bytes())
    except (OSError, yaml.YAMLError) as exc:
        return RunnerTable(path=path, hardware={}, found=True, problem=f"unreadable: {exc}")
    table = data.get("hardware") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        return RunnerTable(path=path, hardware={}, found=True,
                           problem="no 'hardware:' mapping of runner labels")
    hardware: dict[str, RunnerHardware] = {}
    for label, row in table.items():
        dram = row.get("available-cpu-dram-mib") if isinstance(row, dict) else None
        gpus = row.get("gpus-per-node") if isinstance(row, dict) else None
        if (isinstance(dram, int) and isinstance(gpus, int) and not isinstance(dram, bool)
                and not isinstance(gpus, bool) and dram > 0 and gpus > 0):
            hardware[str(label)] = RunnerHardware(available_cpu_dram_mib=dram,
                                                  gpus_per_node=gpus)
    return RunnerTable(path=path, hardware=hardware, found=True)


def cluster_runner_problem(runner: str, cluster_prefix: str) -> str | None:
    """InferenceX runs every agentic point on one exact fleet: a cluster label (`cluster:`,
    `model.CLUSTER_LABEL_PREFIX`)."""
    if runner.startswith(cluster_prefix):
        return None
    return (f"got {runner!r} for an entry with agentic-coding scenarios (expected a "
            f"'{cluster_prefix}<name>' runner, so every point runs on one exact fleet)")


def _replica_gpus_per_node(parallel: Parallelism, gpus_per_node: int) -> int:
    """GPUs one worker replica takes on a node: a replica past a node fills whole nodes, a
    smaller one tiles its node evenly (InferenceX refuses anything else)."""
    replica = parallel.tp * parallel.pp * parallel.pcp
    if replica > gpus_per_node:
        if replica % gpus_per_node:
            raise ValueError(f"prefill worker tp*pp*pcp-size={replica} spans nodes but is not "
                             f"a multiple of gpus-per-node={gpus_per_node}")
        return gpus_per_node
    if gpus_per_node % replica:
        raise ValueError(f"prefill worker tp*pp*pcp-size={replica} does not divide "
                         f"gpus-per-node={gpus_per_node} evenly")
    return replica


def total_cpu_dram_gb(server: ServerConfig, hardware: RunnerHardware) -> int:
    """InferenceX's `total-cpu-dram-gb`: the node's capped DRAM x utilization x the share of
    the node's GPUs the server (single-node) or a prefill replica (multinode) takes. 0 without
    DRAM offloading. Raises ValueError when the topology does not fit the node."""
    if server.offloading != "dram" or server.dram_utilization is None:
        return 0
    gpn = hardware.gpus_per_node
    if server.prefill is not None:
        gpus = _replica_gpus_per_node(server.prefill.parallel, gpn)
    else:
        p = server.parallel
        gpus = p.tp * p.pp * p.pcp
        if gpus > gpn:
            raise ValueError(f"tp*pp*pcp-size={gpus} exceeds gpus-per-node={gpn} of runner "
                             f"{server.runner!r}")
    available = min(hardware.available_cpu_dram_mib, MAX_AVAILABLE_CPU_DRAM_MIB)
    # Decimal, in InferenceX's order of operations, so the floor lands where it lands there.
    share = (Decimal(available) * BYTES_PER_MIB * Decimal(str(server.dram_utilization))
             * gpus / gpn)
    return int(share / BYTES_PER_GB)


def context_length(model_prefix: str) -> int:
    """The `{max_model_len}` an agentic server of this model prefix is launched with."""
    if model_prefix.startswith(FULL_CORPUS_PREFIXES):
        return FULL_CORPUS_CONTEXT
    return CORPUS_256K_CONTEXT


def offload_suffix(server: ServerConfig) -> str:
    """`kvnone`, or `kv<mode>-<backend name>` (`kvdram-hicache`)."""
    if server.offloading == "none":
        return "kvnone"
    backend = (server.kv_offload_backend or "").split("@")[0]
    return f"kv{server.offloading}-{backend}" if backend else f"kv{server.offloading}"


def exp_name(server: ServerConfig, conc: int) -> str:
    """InferenceX's exp-name of one agentic point (one concurrency per multinode row)."""
    if server.prefill is not None and server.decode is not None:
        name = (f"{server.model_prefix}_p{server.prefill.num_worker}x"
                f"{server.prefill.parallel.tp}_d{server.decode.num_worker}x"
                f"{server.decode.parallel.tp}_conc{conc}")
        return name + (f"_{offload_suffix(server)}" if server.offloading != "none" else "")
    name = f"{server.model_prefix}_tp{server.parallel.tp}_conc{conc}_{offload_suffix(server)}"
    return name + (f"_spec-{server.spec_decoding}" if server.spec_decoding != "none" else "")


def marker_fields(server: ServerConfig, conc: int) -> dict[str, object]:
    """What an agentic point adds to its `inferbench(...)` marker."""
    return {
        "scenario": SCENARIO,
        "kv_offloading": server.offloading,
        "kv_offload_backend": (server.kv_offload_backend or "").split("@")[0] or None,
        "total_cpu_dram_gb": server.total_cpu_dram_gb,
        "exp_name": exp_name(server, conc),
    }
