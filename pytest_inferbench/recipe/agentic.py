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

from ..frameworks import registry
from ..util import yamllines
from .spec_values import check_keys, read_str_dict, read_str_list

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

SCENARIO = "agentic-coding"
RUNNERS_FILE = "runners.yaml"
# InferenceX caps a node's usable CPU DRAM (3 TB decimal, in MiB) before the utilization.
MAX_AVAILABLE_CPU_DRAM_MIB = 2_861_022
BYTES_PER_MIB = 1024 * 1024
BYTES_PER_GB = 1_000_000_000


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
    def framework(self) -> str: ...
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


def offload_launch(server: ServerConfig
                   ) -> tuple[list[str], dict[str, str], tuple[str, ...]]:
    """The argv words and env a `kv-offloading: dram` point's server gets for its offload
    backend (the framework registry's `kv_offload`), sized from its `total-cpu-dram-gb` split
    over its TP ranks, and the flags it drops; nothing without offloading. ValueError says
    what is missing."""
    if server.offloading != "dram":
        return [], {}, ()
    backend = (server.kv_offload_backend or "").split("@")[0]
    engine = registry.engine_of(server.framework)
    how = registry.get(engine).kv_offload.get(backend) if engine in registry.names() else None
    if how is None:
        raise ValueError(f"kv-offload-backend {backend!r}: the {engine} registry entry gives "
                         "no launch flags for it (frameworks/entries, kv_offload)")
    total = server.total_cpu_dram_gb
    if total is None:
        raise ValueError(f"kv-offloading dram needs total-cpu-dram-gb: no {RUNNERS_FILE} "
                         "with this runner's hardware row beside the recipe")
    ranks = server.parallel.tp
    values = {"{total_cpu_dram_gb}": str(total), "{cpu_dram_gb_per_rank}": str(total // ranks),
              "{cpu_dram_bytes_per_rank}": str(total * BYTES_PER_GB // ranks)}

    def fill(word: str) -> str:
        for placeholder, value in values.items():
            word = word.replace(placeholder, value)
        return word

    return ([fill(w) for w in how["args"]], {k: fill(v) for k, v in how["env"].items()},
            tuple(how["drop"]))


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


# A launch spec's `agentic:` section, applied to an agentic-coding point's server only.
AGENTIC_LAUNCH_KEYS = ("args", "env", "drop", "overlays")
AGENTIC_OVERLAY_KEYS = ("args", "env", "drop")
CONTEXT_PLACEHOLDER = "{max_model_len}"
# InferenceX's build_replay_cmd points AIPerf at the chat endpoint for every agentic replay
# (`--endpoint /v1/chat/completions --endpoint-type chat`): the server frames the history with
# the model's chat template, whatever the fixed-seq-len client of the spec does.
REPLAY_ENDPOINT = "/v1/chat/completions"


@dataclass(frozen=True)
class AgenticLaunch:
    """How an agentic point's server differs from the spec's fixed-seq-len one, as InferenceX's
    agentic script for the config starts it: the flags it `drop`s (each with its value words),
    the `args` it adds (after the overlays') and the `env` on top. `overlays` hold the same
    per overlay name (`mtp`, `dcp`, ...) where the agentic script of that variant differs
    again (another script: `..._mtp.sh`, or a branch of it)."""

    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    drop: tuple[str, ...] = ()
    overlays: tuple[tuple[str, AgenticLaunch], ...] = ()

    def active(self, on: Mapping[str, bool]) -> AgenticLaunch:
        """This section with the overlays that are `on` applied in order: each drops its flags
        from the words before it (the spec's and the section's) and adds its own after them."""
        args, env, drop = list(self.args), dict(self.env), list(self.drop)
        for name, overlay in self.overlays:
            if on.get(name):
                args = drop_flags(args, overlay.drop) + list(overlay.args)
                env.update(overlay.env)
                drop += overlay.drop
        return AgenticLaunch(tuple(args), tuple(env.items()), tuple(drop))


def drop_flags(words: list[str], flags: tuple[str, ...], keep: str = "") -> list[str]:
    """`words` without each of `flags`: `--flag=value`, or `--flag` and the value words after
    it (up to the next flag; `keep`, the overlays' mark, is no value)."""
    out: list[str] = []
    dropping = False
    for word in words:
        if word in flags or any(word.startswith(f"{flag}=") for flag in flags):
            dropping = word in flags
            continue
        if dropping and not word.startswith("-") and word != keep:
            continue
        dropping = False
        out.append(word)
    return out


def native_context(words: list[str]) -> list[str]:
    """`words` without the context length the fixed-seq-len spec sizes from ISL/OSL
    (`--max-model-len {max_model_len}` or `--flag={max_model_len}`): InferenceX's
    benchmark_lib.sh unsets MAX_MODEL_LEN for agentic scripts, so the engine runs at the
    model's native context unless the script passes its own (the spec's `agentic.args`)."""
    out: list[str] = []
    for word in words:
        if word == CONTEXT_PLACEHOLDER:
            if out and out[-1].startswith("-"):
                out.pop()
            continue
        if CONTEXT_PLACEHOLDER not in word:
            out.append(word)
    return out


def native_context_in(content: dict[str, object]) -> dict[str, object]:
    """A config file's content without the keys set to the ISL/OSL-sized context alone."""
    return {k: _native_context_value(v) for k, v in content.items() if v != CONTEXT_PLACEHOLDER}


def _native_context_value(value: object) -> object:
    if isinstance(value, dict):
        return native_context_in(value)
    if isinstance(value, list):
        return [_native_context_value(v) for v in value]
    return value


def server_words(words: list[str], launch: AgenticLaunch, framework: str, mark: str
                 ) -> list[str]:
    """A fixed-seq-len spec's argv words (base or overlay; `mark`, the overlays' place) as an
    agentic point's server has them: native context, prefix caching not turned off (the
    framework registry's `prefix_caching_off`), the section's `drop`s gone."""
    engine = registry.engine_of(framework)
    off = registry.get(engine).prefix_caching_off if engine in registry.names() else ()
    return drop_flags(native_context(words), (*off, *launch.drop), keep=mark)


def read_agentic_launch(path: Path, value: object, overlay_names: tuple[str, ...] = ()
                        ) -> AgenticLaunch:
    """A launch spec's `agentic:` section (none: nothing but the rules of `server_words`);
    `overlay_names` are those its `overlays` may name, in the order they apply."""
    section = check_keys(path, "agentic", value, AGENTIC_LAUNCH_KEYS)
    overlays = check_keys(path, "agentic.overlays", section.get("overlays", {}), overlay_names)
    return AgenticLaunch(
        args=tuple(read_str_list(path, "agentic.args", section.get("args", []))),
        env=tuple(read_str_dict(path, "agentic.env", section.get("env", {})).items()),
        drop=tuple(read_str_list(path, "agentic.drop", section.get("drop", []))),
        overlays=tuple((name, _read_overlay(path, f"agentic.overlays.{name}", overlays[name]))
                       for name in overlay_names if name in overlays))


def _read_overlay(path: Path, where: str, value: object) -> AgenticLaunch:
    overlay = check_keys(path, where, value, AGENTIC_OVERLAY_KEYS)
    return AgenticLaunch(
        args=tuple(read_str_list(path, f"{where}.args", overlay.get("args", []))),
        env=tuple(read_str_dict(path, f"{where}.env", overlay.get("env", {})).items()),
        drop=tuple(read_str_list(path, f"{where}.drop", overlay.get("drop", []))))
