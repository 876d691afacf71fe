"""One allocation's life: `salloc --no-shell`, its state and hosts, `scancel`; stale sweeps.

Every call is a Slurm client command run as an argv with a timeout (a slurmctld that stops
answering makes a clear error, not a hang). An allocation registers its cancel with the reaper
before salloc even runs, so an interrupt while it waits in the queue cancels it too.
"""

from __future__ import annotations

import contextlib
import getpass
import socket
import subprocess
import threading
import time
from typing import TYPE_CHECKING

from .. import reaper
from ..base import ServerStartError
from . import commands
from .commands import JobInfo

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ...options import SlurmSettings

COMMAND_TIMEOUT_S = 30.0
STATE_POLL_S = 1.0  # at most one scontrol per second per allocation
# Pending reasons that say the request exceeds what the partition can ever give (more nodes,
# GPUs or time than it has; constraints no node meets): Slurm keeps such a job queued, and
# salloc waits for it, forever. They can also show while a node is down or drained, so one
# fails the start only once it has held this long.
UNSATISFIABLE_REASONS = frozenset({"PartitionConfig", "PartitionNodeLimit",
                                   "PartitionTimeLimit", "BadConstraints"})
UNSATISFIABLE_GRACE_S = 30.0
SETTLE_WAIT_S = 5.0  # a job COMPLETING until its last step process is gone
GONE_WAIT_S = 10.0  # after scancel: until the job leaves squeue (its steps have ended)


class SlurmCommandError(RuntimeError):
    pass


def run_command(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """stdout of a Slurm client command; SlurmCommandError with its stderr when it fails."""
    try:
        done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise SlurmCommandError(f"{argv[0]} not found: is this a Slurm login node?") from None
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(f"{' '.join(argv[:3])} did not answer in {timeout_s:g}s") from None
    if done.returncode != 0:
        raise SlurmCommandError(f"{' '.join(argv[:3])} exited with code {done.returncode}: "
                                f"{done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


class Allocation:
    """A `salloc --no-shell` job holding the nodes of one server."""

    def __init__(self, settings: SlurmSettings, *, name: str, comment: str, nodes: int,
                 gpus_per_node: int, queue_timeout_s: float) -> None:
        self.name = name
        self.comment = comment
        self.queue_timeout_s = queue_timeout_s
        self.job_id = ""
        self.hosts: tuple[str, ...] = ()
        self._argv = commands.salloc_argv(settings, name=name, comment=comment, nodes=nodes,
                                          gpus_per_node=gpus_per_node)
        self._info: JobInfo | None = None
        self._info_at = 0.0
        self._cancelled = False
        self._marks_checked = False
        self._unsatisfiable_since: float | None = None

    def request(self) -> None:
        """Run salloc until the nodes are granted (it may wait in the queue); raise
        ServerStartError with salloc's words when Slurm refuses."""
        reaper.track(self, self.cancel)
        try:
            # A new session is harmless here (see slurm/steps.py Step): salloc waits, it does
            # not compute, so its own CPU group under sched autogroups costs the client nothing.
            process = subprocess.Popen(self._argv, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        except FileNotFoundError:
            raise ServerStartError("salloc not found: is this a Slurm login node?") from None
        lines: list[str] = []
        reader = threading.Thread(target=_collect, args=(process, lines), daemon=True)
        reader.start()
        try:
            withdrawn = self._wait_granted(process, lines)
        except BaseException:
            reaper.stop_process_group(process, grace_s=1.0)  # salloc withdraws its request
            raise
        reader.join(timeout=COMMAND_TIMEOUT_S)  # salloc has exited: its output is closed
        output = "".join(lines)
        self.job_id = commands.granted_job_id(output) or commands.announced_job_id(output) or ""
        if withdrawn is not None:
            raise ServerStartError(f"{withdrawn}\nargv: {self._argv}")
        if process.returncode != 0 or not commands.granted_job_id(output):
            raise ServerStartError(f"salloc exited with code {process.returncode}: "
                                   f"{output.strip() or '(no output)'}\nargv: {self._argv}")
        try:
            foreign = self._foreign_marks()
            info = self.info(fresh=True)
            if foreign is None:
                self.hosts = tuple(run_command(commands.hostnames_argv(info.nodelist)).split())
        except SlurmCommandError as exc:
            raise ServerStartError(f"slurm job {self.job_id}: {exc}") from None
        if foreign is not None:
            self.cancel()
            raise ServerStartError(f"{foreign}\nargv: {self._argv}")
        if not self.hosts:
            raise ServerStartError(f"{info.describe()}: no nodes in the allocation")

    def _wait_granted(self, process: subprocess.Popen[bytes], lines: list[str]) -> str | None:
        """Wait for salloc to exit: None once it has exited on its own. While its job is
        queued, watch it; a job that cannot be left queued is cancelled, salloc stopped, and
        the reason returned."""
        started = time.monotonic()
        while True:
            try:
                process.wait(timeout=STATE_POLL_S)
                return None
            except subprocess.TimeoutExpired:
                pass
            self.job_id = self.job_id or commands.announced_job_id("".join(lines)) or ""
            withdraw = self._queued_problem(time.monotonic() - started)
            if withdraw is not None:
                self.cancel()
                reaper.stop_process_group(process, grace_s=1.0)
                return withdraw

    def _queued_problem(self, waited_s: float) -> str | None:
        """Why the queued job must not wait any longer, else None: its name or comment are not
        this run's; Slurm's reason says it can never start (held UNSATISFIABLE_GRACE_S); or it
        is still queued after the startup timeout, whatever the reason (`--hold`, `--begin`,
        a dependency, a busy partition): a run must not wait unseen for ever."""
        info: JobInfo | None = None
        if self.job_id:
            try:
                foreign = self._foreign_marks()
                if foreign is not None:
                    return foreign
                info = self.info(fresh=True)
            except SlurmCommandError:
                pass  # slurmctld busy: salloc's own wait goes on, the timeout still holds
        if info is not None and info.state == "PENDING" and info.reason in UNSATISFIABLE_REASONS:
            now = time.monotonic()
            self._unsatisfiable_since = self._unsatisfiable_since or now
            if now - self._unsatisfiable_since >= UNSATISFIABLE_GRACE_S:
                return (f"{info.describe()}: Slurm will not start this allocation as asked "
                        f"(the request exceeds what the partition can give); it was cancelled")
        else:
            self._unsatisfiable_since = None
        if waited_s < self.queue_timeout_s or (info is not None and info.live):
            return None  # a job just granted: salloc says so in a moment
        if info is None or not info.state:
            what = f"slurm job {self.job_id or '(id not announced)'} still not granted"
        else:
            reason = f" (reason {info.reason})" if info.reason and info.reason != "None" else ""
            what = f"slurm job {self.job_id} still {info.state}{reason}"
        return (f"{what} after {self.queue_timeout_s:g} s startup timeout; it was cancelled "
                f"(--inferbench-startup-timeout, else the launch spec's startup-timeout, bounds "
                f"the wait in the queue)")

    def _foreign_marks(self) -> str | None:
        """Once per job: a name or comment other than the ones asked for (a salloc word of the
        user's replaced them; `options.slurm` refuses the spellings it knows) would hide the
        job from the stale sweep of a later run, so such a job is not kept."""
        if self._marks_checked or not self.job_id:
            return None
        text = run_command(commands.job_marks_argv(self.job_id)).strip()
        self._marks_checked = True
        name, _, comment = text.partition("|")
        if not text or (name == self.name and commands.comment_owner(comment)
                        == commands.comment_owner(self.comment)):
            return None
        return (f"slurm job {self.job_id} is named {name!r} with comment {comment!r}, not "
                f"{self.name!r} with {self.comment!r}: a word of --inferbench-slurm-args "
                f"replaced them, and a later run could not cancel this job if this one were "
                f"killed; it was cancelled")

    def info(self, fresh: bool = False) -> JobInfo:
        """The job's state, asked of slurmctld at most once per STATE_POLL_S."""
        now = time.monotonic()
        if fresh or self._info is None or now - self._info_at >= STATE_POLL_S:
            try:
                text = run_command(commands.job_info_argv(self.job_id))
            except SlurmCommandError as exc:
                if "Invalid job id" not in str(exc):
                    raise
                text = ""  # purged from slurmctld's memory: long over
            self._info, self._info_at = commands.parse_job_info(self.job_id, text), now
        assert self._info is not None
        return self._info

    def final_info(self, wait_s: float = SETTLE_WAIT_S) -> JobInfo:
        """The job's state once it has settled: COMPLETING (steps still ending) says nothing
        about why it ends, the state after it (TIMEOUT, CANCELLED, ...) does."""
        deadline = time.monotonic() + wait_s
        info = self.info(fresh=True)
        while info.state == "COMPLETING" and time.monotonic() < deadline:
            time.sleep(0.2)
            info = self.info(fresh=True)
        return info

    def cancel(self) -> None:
        """scancel (idempotent), then wait until the job has left the queue."""
        if self._cancelled:
            return
        self._cancelled = True
        reaper.untrack(self)
        if not self.job_id:  # salloc never said its id: cancel by the run-unique name
            with contextlib.suppress(SlurmCommandError):
                run_command(("scancel", "--quiet", f"--name={self.name}"))
            return
        with contextlib.suppress(SlurmCommandError):
            if reaper.interrupted():
                run_command(commands.scancel_argv([self.job_id], kill=True))
            run_command(commands.scancel_argv([self.job_id]))
        deadline = time.monotonic() + GONE_WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(SlurmCommandError):
                if self.info(fresh=True).state not in commands.ACTIVE_STATES:
                    return
            time.sleep(0.2)


def _collect(process: subprocess.Popen[bytes], lines: list[str]) -> None:
    """salloc's output as it comes (it says the job id before the job is granted)."""
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.decode("utf-8", "replace"))


def this_host_names() -> set[str]:
    name = socket.gethostname()
    return {name, name.split(".")[0], socket.getfqdn(), "localhost"}


def is_this_host(host: str) -> bool:
    """Is an allocated node this machine (a one-host cluster, a local test)?"""
    if host in this_host_names():
        return True
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def sweep_stale_jobs() -> list[str]:
    """Session start, controller only: cancel this user's inferbench allocations whose owning
    pytest process on this host is gone (killed before its teardown). Jobs of live runs and
    of other hosts are left alone. Returns one line per cancelled job."""
    try:
        jobs = commands.parse_own_jobs(run_command(commands.own_jobs_argv(getpass.getuser())))
    except SlurmCommandError:
        return []  # no Slurm answers: the backend reports that itself, with context
    stale = [job for job in jobs if job.name.startswith(commands.JOB_NAME_PREFIX)
             and (owner := commands.comment_owner(job.comment)) is not None
             and reaper.is_stale({reaper.LABEL_OWNER: owner})]
    if stale:
        with contextlib.suppress(SlurmCommandError):
            run_command(commands.scancel_argv([job.job_id for job in stale]))
    return [f"cancelled stale slurm job {job.job_id} ({job.name}, {job.state})" for job in stale]
