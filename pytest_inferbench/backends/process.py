"""The `process` backend: the launch spec's argv as a local subprocess (bare-metal runners).

The server runs in its own process group (optionally behind a prefix such as `srun ...`,
`--inferbench-process-prefix`), its output goes to a log file from the first byte, readiness
polls health and the exit status together, and teardown kills the whole group.
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING

from ..redact import Redactor
from . import reaper
from .base import Backend, ServerStartError
from .readiness import LogPump, free_port, log_path_for

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from ..launch import ServerSpec
    from ..recipe import ServerConfig
    from .base import StartContext
    from .supervised import SupervisedHandle

LOCALHOST = "127.0.0.1"


class LocalProcess:
    """A server subprocess in its own session/process group, output pumped to a log file."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_path: Path,
                 redactor: Redactor) -> None:
        self.name = name
        self.argv = tuple(argv)
        try:
            self.process = subprocess.Popen(
                self.argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True)
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


def process_env(spec: ServerSpec) -> dict[str, str]:
    """The host environment (a local server sees HF_TOKEN and friends as any local program
    would), the spec's variables on top."""
    return {**os.environ, **spec.env_dict}


def start_local(name: str, argv: Sequence[str], spec: ServerSpec, port: int,
                ctx: StartContext, simulated: bool = False) -> SupervisedHandle:
    settings = ctx.options
    redactor = Redactor.from_env(settings.pass_env)
    log_path = log_path_for(ctx.results_dir, name, ctx.worker_id, ctx.log_paths)
    from .supervised import start_supervised

    server = LocalProcess(name, argv, process_env(spec), log_path, redactor)
    return start_supervised(server, base_url=f"http://{LOCALHOST}:{port}", spec=spec, ctx=ctx,
                            simulated=simulated)


class ProcessBackend(Backend):
    name = "process"

    def start(self, server: ServerConfig, spec: ServerSpec,
              ctx: StartContext) -> SupervisedHandle:
        port = free_port()
        argv = (*ctx.options.process_prefix, *spec.argv_for_port(port))
        return start_local(server.node_name, argv, spec, port, ctx)
