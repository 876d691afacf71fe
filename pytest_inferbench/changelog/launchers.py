"""The files that start a server node: its launch spec and InferenceX's benchmark script for it.

InferenceX's runners pick the script from the config (`runners/launch_*.sh`, with the scenario
directory its workflows pass as SCENARIO_SUBDIR): single-node
`benchmarks/single_node/<fixed_seq_len|agentic>/<prefix>_<precision>_<gpu>_<framework>[_mtp].sh`,
falling back, when that script does not exist, to the name without `_<framework>` (except for
TRT-LLM and ATOM, whose fallback keeps `_trt` / `_atom`: the same name); multinode
`benchmarks/multi_node/[agentic/]<prefix>_<precision>_<gpu>_<framework>.sh`. A script in any
other place (a `deprecated/` directory, another scenario's) starts none of the node's points.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..recipe.launch import launch_spec_path

if TYPE_CHECKING:
    from pathlib import Path

    from ..recipe.layout import Layout
    from ..recipe.model import ServerConfig

SCENARIO_DIRS = {"fixed-seq-len": "fixed_seq_len", "agentic-coding": "agentic"}
TAGGED_FALLBACK = ("trt", "atom")


def benchmark_scripts(server: ServerConfig, top: Path) -> tuple[Path, ...]:
    """The script InferenceX runs for the server, in the checkout at `top`; two when the
    preferred name does not exist (a branch that deletes it moves the node to the fallback)."""
    stem = f"{server.model_prefix}_{server.precision}_{server.hardware.lower()}"
    if server.multinode:
        directory = top / "benchmarks" / "multi_node"
        if server.scenario == "agentic-coding":
            directory = directory / "agentic"
        return (directory / f"{stem}_{server.framework}.sh",)
    directory = top / "benchmarks" / "single_node" / SCENARIO_DIRS.get(server.scenario,
                                                                       "fixed_seq_len")
    spec = "_mtp" if server.spec_decoding == "mtp" else ""
    preferred = directory / f"{stem}_{server.framework}{spec}.sh"
    if preferred.is_file() or server.framework in TAGGED_FALLBACK:
        return (preferred,)
    return (preferred, directory / f"{stem}{spec}.sh")


def launch_files(server: ServerConfig, layout: Layout, top: Path) -> tuple[Path, ...]:
    """Every file whose change starts the server differently, its master entry aside."""
    spec = launch_spec_path(server, layout.launch_dir_for(server.source))
    return (spec, *benchmark_scripts(server, top))
