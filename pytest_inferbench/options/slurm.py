"""The slurm backend's options (`--inferbench-slurm-*`, `inferbench_slurm_*`) and their frozen
`SlurmSettings`, part of `options.Settings`."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import pytest


IniType = Literal["string", "linelist", "args", "bool"]


class AddIni(Protocol):
    """`options._addini`: declares an ini key and records its default."""

    def __call__(self, parser: pytest.Parser, name: str, text: str, type: IniType = ...,
                 default: object = ...) -> None: ...


SLURM_OPTIONS = (
    # (name after --inferbench-slurm- / inferbench_slurm_, metavar, help)
    ("partition", "NAME", "partition of every allocation (salloc --partition)"),
    ("account", "NAME", "account charged for every allocation (salloc --account)"),
    ("time", "TIME", "time limit of every allocation, Slurm format (salloc --time, e.g. 500)"),
    ("gres", "NAME", "generic resource requested per GPU of a server, --gres=NAME:<tp> "
                     "(default gpu, none with --inferbench-slurm-sim; none requests no "
                     "gres)"),
    ("args", "ARGV", "more salloc words for every allocation, e.g. '--exclude=n1 --mem=0'"),
    ("squash-dir", "DIR", "container mode: where enroot squashfs images are imported once per "
                          "image; must be visible to the compute nodes "
                          "(default ~/.cache/inferbench/squash)"),
    ("container-workdir", "PATH", "container mode: the current directory is mounted here and "
                                  "the server starts in it (default /workspace)"),
)
SLURM_SWITCHES = (
    ("exclusive", "allocate whole nodes (salloc --exclusive)"),
    ("container", "run servers in the launch spec's image through pyxis "
                  "(srun --container-image=...), imported with enroot; default: plain processes"),
    ("sim", "run the simulated server in place of each single-process server, with the launch "
            "spec's argv (as the sim-server backend does): a cluster tried without GPUs "
            "(no gres is requested unless --inferbench-slurm-gres names one)"),
)


def add_slurm_options(parser: pytest.Parser, addini: AddIni) -> None:
    group = parser.getgroup("inferbench")
    for name, metavar, text in SLURM_OPTIONS:
        group.addoption(f"--inferbench-slurm-{name}", default=None, metavar=metavar,
                        help=f"slurm backend: {text}")
        ini = f"inferbench_slurm_{name.replace('-', '_')}"
        if name == "args":
            addini(parser, ini, f"slurm backend: {text}", type="args", default=[])
        else:
            addini(parser, ini, f"slurm backend: {text}", type="string", default="")
    for name, text in SLURM_SWITCHES:
        group.addoption(f"--inferbench-slurm-{name}", action="store_true", default=False,
                        help=f"slurm backend: {text}")
        addini(parser, f"inferbench_slurm_{name}", f"slurm backend: {text}", type="bool",
                      default=False)
    addini(parser, "inferbench_slurm_container_mounts",
                  "slurm backend, container mode: more host:container[:ro] mounts, one a line",
                  type="linelist", default=[])


DEFAULT_SQUASH_DIR = Path("~/.cache/inferbench/squash").expanduser()


@dataclass(frozen=True)
class SlurmSettings:
    """Options of the slurm backend (command line over ini)."""

    partition: str = ""
    account: str = ""
    time: str = ""
    gres: str = "gpu"  # "" = request no gres
    args: tuple[str, ...] = ()
    exclusive: bool = False
    container: bool = False
    sim: bool = False
    squash_dir: Path = DEFAULT_SQUASH_DIR
    container_workdir: str = "/workspace"
    container_mounts: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: pytest.Config) -> SlurmSettings:
        def value(name: str) -> str:
            cli = config.getoption(f"inferbench_slurm_{name}")
            return str(cli) if cli is not None else str(config.getini(f"inferbench_slurm_{name}"))

        def switch(name: str) -> bool:
            return bool(config.getoption(f"inferbench_slurm_{name}")
                        or config.getini(f"inferbench_slurm_{name}"))

        cli_args = config.getoption("inferbench_slurm_args")
        # A simulated server uses no GPU: a cluster without a GPU gres must not need a flag
        # to try it, and one with GPUs keeps them free.
        gres = value("gres") or ("none" if switch("sim") else "gpu")
        defaults = cls()
        return cls(
            partition=value("partition"),
            account=value("account"),
            time=value("time"),
            gres="" if gres.lower() == "none" else gres,
            args=tuple(shlex.split(cli_args) if cli_args is not None
                       else config.getini("inferbench_slurm_args")),
            exclusive=switch("exclusive"),
            container=switch("container"),
            sim=switch("sim"),
            squash_dir=Path(value("squash_dir")).expanduser() if value("squash_dir")
            else defaults.squash_dir,
            container_workdir=value("container_workdir") or defaults.container_workdir,
            container_mounts=tuple(config.getini("inferbench_slurm_container_mounts")),
        )
