"""The recipe model: frozen dataclasses for an InferenceX master config after validation.

`schema.py` turns YAML into these objects (or into file:line errors); nothing past it sees
dicts. One `ServerConfig` is one server node: a master entry's search-space row, which serves
every ISL/OSL of that entry. One `BenchPoint` is one (isl, osl, concurrency) of a server.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SPEC_DECODING_VALUES = ("mtp", "draft_model", "none")

# Runner-name prefixes (as in InferenceX runners.yaml) mapped to the accelerator they carry.
# Longest prefix wins, so "mi355x-disagg" and "gb300-nv" resolve like their GPU.
GPU_BY_RUNNER_PREFIX: dict[str, str] = {
    "mi300x": "MI300X",
    "mi325x": "MI325X",
    "mi355x": "MI355X",
    "h100": "H100",
    "h200": "H200",
    "b200": "B200",
    "b300": "B300",
    "gb200": "GB200",
    "gb300": "GB300",
}


def hardware_for_runner(runner: str) -> str | None:
    """The GPU of a runner type (`mi355x-disagg` -> MI355X), or None when unknown."""
    name = runner.lower()
    for prefix in sorted(GPU_BY_RUNNER_PREFIX, key=len, reverse=True):
        if name == prefix or name.startswith(prefix + "-") or name.startswith(prefix + "_"):
            return GPU_BY_RUNNER_PREFIX[prefix]
    return None


def expand_concurrency(start: int, end: int, step: int = 2) -> tuple[int, ...]:
    """InferenceX range expansion: multiply by `step`, the last value clamped to `end`."""
    values = [start]
    conc = start
    while conc != end:
        conc = min(conc * step, end)
        values.append(conc)
    return tuple(values)


def seq_len_name(isl: int, osl: int) -> str:
    """InferenceX `seq_len_stoi` inverse: 1k1k, 8k1k, else isl_osl."""
    known = {(1024, 1024): "1k1k", (8192, 1024): "8k1k"}
    return known.get((isl, osl), f"{isl}_{osl}")


@dataclass(frozen=True)
class SeqLenSweep:
    """One ISL/OSL of a server node and the concurrencies swept at it."""

    isl: int
    osl: int
    concurrencies: tuple[int, ...]
    line: int  # 1-based line of the search-space row in the recipe file


@dataclass(frozen=True)
class ServerConfig:
    """One server node: everything that decides how the server is started."""

    config_key: str
    image: str
    model: str
    model_prefix: str
    runner: str
    hardware: str
    precision: str
    framework: str
    multinode: bool
    disagg: bool
    tp: int
    ep: int
    dp_attn: bool
    spec_decoding: str
    sweeps: tuple[SeqLenSweep, ...]
    source: Path
    line: int  # 1-based line of the config key
    scenario: str = "fixed-seq-len"  # or "agentic-coding"
    topology: str = ""  # multinode prefill/decode shape, part of the node name
    skip_reason: str | None = None  # parsed and valid, but not runnable by this plugin yet

    @property
    def node_name(self) -> str:
        name = f"{self.config_key}{self.topology}" if self.topology else (
            f"{self.config_key}-tp{self.tp}")
        if self.scenario == "agentic-coding" and "agentic" not in self.config_key:
            name += "-agentic"
        if self.ep > 1 and not self.topology:
            name += f"-ep{self.ep}"
        if self.dp_attn and not self.topology:
            name += "-dpa"
        if self.spec_decoding != "none" and "-mtp" not in self.config_key:
            name += "-mtp" if self.spec_decoding == "mtp" else f"-{self.spec_decoding}"
        return name

    @property
    def launch_spec_name(self) -> str:
        """InferenceX script naming: `<model-prefix>_<precision>_<gpu>_<framework>`."""
        return f"{self.model_prefix}_{self.precision}_{self.hardware.lower()}_{self.framework}"

    @property
    def speculative(self) -> bool:
        return self.spec_decoding != "none"

    def points(self) -> tuple[BenchPoint, ...]:
        return tuple(
            BenchPoint(server=self, isl=s.isl, osl=s.osl, conc=c, line=s.line)
            for s in self.sweeps
            for c in s.concurrencies
        )


@dataclass(frozen=True)
class BenchPoint:
    """One benchmark item: a server node at one ISL/OSL and concurrency."""

    server: ServerConfig
    isl: int
    osl: int
    conc: int
    line: int

    @property
    def name(self) -> str:
        if self.server.scenario == "agentic-coding":
            return f"agentic-conc{self.conc}"
        return f"isl{self.isl}-osl{self.osl}-conc{self.conc}"

    @property
    def max_model_len(self) -> int:
        return self.isl + self.osl + 256

    @property
    def exp_name(self) -> str:
        return f"{self.server.model_prefix}_{seq_len_name(self.isl, self.osl)}"

    def result_filename(self, runner_name: str | None = None) -> str:
        """InferenceX RESULT_FILENAME for this point (runner name defaults to the runner type)."""
        s = self.server
        dpa = "true" if s.dp_attn else "false"
        disagg = "true" if s.disagg else "false"
        return (
            f"{self.exp_name}_{s.precision}_{s.framework}_tp{s.tp}-ep{s.ep}-dpa{dpa}"
            f"_disagg-{disagg}_spec-{s.spec_decoding}_conc{self.conc}_{runner_name or s.runner}"
        )

    def marker_kwargs(self) -> dict[str, object]:
        s = self.server
        return {
            "config_key": s.config_key,
            "model_prefix": s.model_prefix,
            "framework": s.framework,
            "precision": s.precision,
            "runner": s.runner,
            "hardware": s.hardware,
            "tp": s.tp,
            "ep": s.ep,
            "dp_attn": s.dp_attn,
            "spec_decoding": s.spec_decoding,
            "isl": self.isl,
            "osl": self.osl,
            "conc": self.conc,
        }


@dataclass(frozen=True)
class RecipeFile:
    """A whole master config: its server nodes in file order."""

    path: Path
    servers: tuple[ServerConfig, ...]
