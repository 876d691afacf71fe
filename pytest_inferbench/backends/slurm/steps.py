"""The processes of one server inside its allocation, each an `srun` step, watched as one.

srun runs here, in its own process group, and forwards its step's output: every line goes
to the node's log file (prefixed with the role when the server has several processes). The
server counts as exited when any step exits *or* the job leaves RUNNING (time limit,
scancel, preemption, node failure); `exit_detail` then names the job's state and Slurm's
reason, which every failure message carries next to the log tail.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import reaper
from ..base import ServerStartError
from ..readiness import LogPump
from .jobs import SlurmCommandError

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    from ...results.redact import Redactor
    from .jobs import Allocation

SRUN_EXIT_WAIT_S = 5.0  # the job ended: srun follows once its step is torn down
STEP_STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class StepLaunch:
    """One process to start: which role instance, where, with what."""

    label: str  # "" for a single-process server, else "<role>.<index>"
    argv: tuple[str, ...]  # the whole srun argv
    env: dict[str, str]


class Step:
    def __init__(self, launch: StepLaunch, redactor: Redactor) -> None:
        self.label = launch.label
        try:
            # A new session, unlike a local server (`reaper.start_in_own_group`): srun only
            # relays, the server runs on the allocated nodes, so the CPU group of its own that
            # a session gets under sched autogroups takes nothing from the load client here.
            self.process = subprocess.Popen(
                launch.argv, env=launch.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise ServerStartError(f"cannot run srun: {redactor.text(str(exc))}") from None

    def chunks(self) -> Iterator[bytes]:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        return iter(lambda: os.read(fd, 65536), b"")


def _merged(steps: Sequence[Step]) -> Iterator[bytes]:
    """The output of several steps as one stream of whole lines, each prefixed by its step."""
    if len(steps) == 1 and not steps[0].label:
        yield from steps[0].chunks()
        return
    lines: queue.Queue[bytes | None] = queue.Queue()

    def pump(step: Step) -> None:
        pending = b""
        prefix = f"[{step.label}] ".encode()
        try:
            for chunk in step.chunks():
                pending += chunk
                *whole, pending = pending.split(b"\n")
                for line in whole:
                    lines.put(prefix + line + b"\n")
        finally:
            if pending:
                lines.put(prefix + pending + b"\n")
            lines.put(None)

    for step in steps:
        threading.Thread(target=pump, args=(step,), daemon=True).start()
    open_streams = len(steps)
    while open_streams:
        line = lines.get()
        if line is None:
            open_streams -= 1
        else:
            yield line


class SlurmServer:
    """The `Supervised` of a slurm server: its allocation, its steps and their one log."""

    def __init__(self, name: str, allocation: Allocation, launches: Sequence[StepLaunch],
                 log_path: Path, redactor: Redactor) -> None:
        self.name = name
        self.allocation = allocation
        self.steps: list[Step] = []
        self._ended: str | None = None
        try:
            for launch in launches:
                self.steps.append(Step(launch, redactor))
        except BaseException:
            self.terminate()
            raise
        self.log = LogPump(_merged(self.steps), log_path, redactor)

    def exit_code(self) -> int | None:
        for step in self.steps:
            code = step.process.poll()
            if code is not None:
                self._ended = self._ended or self._step_ended(step, code)
                return code
        try:
            info = self.allocation.info()
        except SlurmCommandError as exc:
            self._ended = f"slurm does not answer: {exc}"
            return None  # cannot tell: keep serving, the HTTP checks decide
        if info.live:
            return None
        self._ended = self.allocation.final_info().describe()
        deadline = time.monotonic() + SRUN_EXIT_WAIT_S
        while time.monotonic() < deadline:  # srun's own last words belong in the log tail
            codes = [s.process.poll() for s in self.steps]
            if all(c is not None for c in codes):
                return next(c for c in codes if c is not None)
            time.sleep(0.1)
        return -1

    def _step_ended(self, step: Step, code: int) -> str:
        what = f"srun step{' ' + step.label if step.label else ''} exited with code {code}"
        try:
            info = self.allocation.info(fresh=True)
            if not info.live:
                info = self.allocation.final_info()
        except SlurmCommandError:
            return what
        if info.live:
            return f"{what}; {info.describe()}: the server process ended inside the job"
        return f"{what}; {info.describe()}"

    def exit_detail(self) -> str:
        return self._ended or ""

    def terminate(self) -> None:
        """scancel the allocation (Slurm ends every step), then make sure no srun is left."""
        try:
            self.allocation.cancel()
        finally:
            for step in self.steps:
                reaper.stop_process_group(step.process, grace_s=STEP_STOP_GRACE_S)
