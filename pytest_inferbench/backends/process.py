"""The `process` backend: the launch spec's argv as a local subprocess (bare-metal runners).

The server runs in its own process group (optionally behind a prefix such as `srun ...`,
`--inferbench-process-prefix`), its output goes to a log file from the first byte, readiness
polls health and the exit status together, and teardown kills the whole group.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..results.redact import Redactor
from . import reaper
from .base import Backend, ServerStartError
from .readiness import LogPump, free_port, log_path_for

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from ..recipe.launch import ServerSpec
    from ..recipe.model import ServerConfig
    from .base import StartContext
    from .supervised import SupervisedHandle

LOCALHOST = "127.0.0.1"


class LocalProcess:
    """A server subprocess in its own process group (in this run's session), output pumped to
    a log file."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_path: Path,
                 redactor: Redactor) -> None:
        self.name = name
        self.argv = tuple(argv)
        try:
            with reaper.sigint_held():
                self.process = reaper.start_in_own_group(self.argv, env)
                reaper.track(self, self.terminate)  # stopped at exit whatever happens next
        except OSError as exc:
            raise ServerStartError(
                f"server {name}: cannot run {self.argv[0]!r}: {redactor.text(str(exc))}") from None
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        # os.read returns what is there (no waiting for a full buffer), so lines reach the
        # file as the server writes them.
        self.log = LogPump(iter(lambda: os.read(fd, 65536), b""), log_path, redactor)

    def exit_code(self) -> int | None:
        return self.process.poll()

    def exit_detail(self) -> str:
        return ""

    def terminate(self) -> None:
        reaper.stop_process_group(self.process)


# Host variables a local server gets without being named: what finding programs, libraries,
# devices, caches and the Slurm step it may run in needs. Nothing else of the host environment
# (tokens, cloud keys) reaches it unless `--inferbench-pass-env` names it.
HOST_VARIABLES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "HF_HOME",
    "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_CACHE", "ROCM_PATH"})
HOST_PREFIXES = ("LC_", "CUDA_", "ROCR_", "HIP_", "HSA_", "NCCL_", "RCCL_", "SLURM_", "XDG_",
                 "INFERBENCH_")


def process_env(spec: ServerSpec, pass_env: Sequence[str] = (),
                environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """An allow-list of the host environment (`HOST_VARIABLES`, `HOST_PREFIXES` and the names
    in `--inferbench-pass-env`), the spec's variables on top."""
    env = os.environ if environ is None else environ
    passed = set(pass_env)
    kept = {name: value for name, value in env.items()
            if name in HOST_VARIABLES or name in passed or name.startswith(HOST_PREFIXES)}
    # The owner mark, inherited by everything the server starts: the next run kills them all
    # if this process dies without its teardown (`reaper.sweep_stale_processes`).
    return {**kept, **spec.env_dict, reaper.OWNER_ENV: reaper.owner_label()}


def start_local(name: str, argv: Sequence[str], spec: ServerSpec, port: int,
                ctx: StartContext, simulated: bool = False) -> SupervisedHandle:
    settings = ctx.options
    redactor = Redactor.from_env(settings.pass_env, urls=(settings.base_url,))
    log_path = log_path_for(ctx.results_dir, name, ctx.worker_id, ctx.log_paths)
    from .supervised import start_supervised

    server = LocalProcess(name, argv, process_env(spec, settings.pass_env), log_path, redactor)
    handle = start_supervised(server, base_url=f"http://{LOCALHOST}:{port}", spec=spec, ctx=ctx,
                              simulated=simulated)
    handle.local_server_pid = server.process.pid  # the client keeps off its bound CPUs
    return handle


class ProcessBackend(Backend):
    name = "process"

    def start(self, server: ServerConfig, spec: ServerSpec,
              ctx: StartContext) -> SupervisedHandle:
        port = free_port()
        argv = (*ctx.options.process_prefix, *spec.argv_for_port(port))
        return start_local(server.node_name, argv, spec, port, ctx)
