"""The slurm backend's options (`--inferbench-slurm-*`, `inferbench_slurm_*`) and their frozen
`SlurmSettings`, part of `options.Settings`."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import pytest

if TYPE_CHECKING:
    from collections.abc import Sequence


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
    ("args", "ARGV", "more salloc words for every allocation, e.g. '--exclude=n1 --mem=0' "
                     "(a --comment follows the backend's owner tag; --job-name, --quiet and "
                     "--clusters are refused)"),
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
    comment: str = ""  # the user's own --comment, kept after the owner tag (`OwnedOption`)
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

        args, comment = salloc_words(config)
        # A simulated server uses no GPU: a cluster without a GPU gres must not need a flag
        # to try it, and one with GPUs keeps them free.
        gres = value("gres") or ("none" if switch("sim") else "gpu")
        defaults = cls()
        return cls(
            partition=value("partition"),
            account=value("account"),
            time=value("time"),
            gres="" if gres.lower() == "none" else gres,
            args=args,
            comment=comment,
            exclusive=switch("exclusive"),
            container=switch("container"),
            sim=switch("sim"),
            squash_dir=Path(value("squash_dir")).expanduser() if value("squash_dir")
            else defaults.squash_dir,
            container_workdir=value("container_workdir") or defaults.container_workdir,
            container_mounts=tuple(config.getini("inferbench_slurm_container_mounts")),
        )


@dataclass(frozen=True)
class OwnedOption:
    """A salloc option the backend sets itself, in the spellings salloc accepts: `--long=V`,
    `--long V`, a long name cut short down to `shortest` letters (getopt takes any
    unambiguous start), `-X V`, `-XV`. `why` says what a user's value would break; None: the
    user's value is kept beside the backend's (the comment)."""

    long: str
    short: str
    shortest: int
    takes_value: bool
    why: str | None

    def match(self, word: str) -> tuple[bool, str | None]:
        """(is this option, its value when written in the same word)."""
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            hit = len(name) >= self.shortest and self.long.startswith(name)
            return hit, (value if eq else None)
        if self.short and word.startswith("-" + self.short):
            return True, (word[2:] or None) if self.takes_value else None
        return False, None


# The job's name (`inferbench-<run>-<worker>-<node>`) and comment (`inferbench owner=<host>:<pid>
# ...`) are how the stale sweep of a later run finds the allocations of a run killed outright,
# and salloc's own messages are how this run learns its job id.
OWNED_OPTIONS = (
    OwnedOption("comment", "", 3, True, None),
    OwnedOption("job-name", "J", 1, True,
                "the backend names every job inferbench-<run>-<worker>-<node>, by which it "
                "finds the jobs of its run"),
    OwnedOption("quiet", "Q", 2, False,
                "the backend reads each job's id from salloc's messages"),
    OwnedOption("clusters", "M", 8, True,
                "the job would run on another cluster, out of sight of this run's srun, "
                "scancel and of the sweep that cancels the jobs of a killed run"),
)
ARGS_OPTION = "--inferbench-slurm-args"
ARGS_INI = "inferbench_slurm_args"


def salloc_words(config: pytest.Config) -> tuple[tuple[str, ...], str]:
    """The user's salloc words (command line over ini) without their comment, and the comment;
    a usage error naming the option for words that cannot be split or that would take a job
    out of this run's hands."""
    cli = config.getoption("inferbench_slurm_args")
    source = ARGS_OPTION if cli is not None else f"ini {ARGS_INI}"
    try:
        words = shlex.split(cli) if cli is not None else list(config.getini(ARGS_INI))
    except ValueError as exc:  # an unbalanced quote; pytest's own getini splits the ini value
        raise pytest.UsageError(f"{source}: cannot split into words ({exc})") from None
    args, comment, problems = split_salloc_words(words)
    if problems:
        raise pytest.UsageError(f"{source}: " + "; ".join(problems))
    return args, comment


def split_salloc_words(words: Sequence[str]) -> tuple[tuple[str, ...], str, list[str]]:
    """(the words without any --comment, the comments joined by "; ", problems): a comment
    is kept next to the owner tag, an option the backend owns is refused."""
    kept: list[str] = []
    comments: list[str] = []
    problems: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        owned = next((o for o in OWNED_OPTIONS if o.match(word)[0]), None)
        if owned is None:
            kept.append(word)
            continue
        shown, value = word, owned.match(word)[1]
        if owned.takes_value and value is None:
            if i >= len(words):
                problems.append(f"{word} needs a value")
                continue
            shown, value = f"{word} {words[i]}", words[i]
            i += 1
        if owned.why is not None:
            problems.append(f"{shown}: not allowed, {owned.why}")
        elif value:
            comments.append(value)
    return tuple(kept), "; ".join(comments), problems
