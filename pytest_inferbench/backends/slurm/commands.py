"""The Slurm command lines this backend runs, and the parsing of what Slurm answers.

Pure functions, no I/O: every argv is a list of words (never a shell string) and the unit
tests pin them. One allocation per server node (see `docs/architecture.md`): its job name
carries the run id and its comment the owning process, so a later run can find and cancel
allocations whose owner died.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ...options import SlurmSettings

JOB_NAME_PREFIX = "inferbench-"
COMMENT_PREFIX = "inferbench owner="
# Job states in which the allocation still holds (or will hold) its nodes.
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                           "RESIZING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING",
                           "STAGE_OUT", "STOPPED"})
LIVE_STATES = frozenset({"CONFIGURING", "RUNNING"})  # the servers can run


def job_name(run_id: str, worker_id: str, node: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", node).strip("-.") or "server"
    return f"{JOB_NAME_PREFIX}{run_id}-{worker_id}-{slug}"[:120]


def job_comment(owner: str, run_id: str, user_comment: str = "") -> str:
    """`inferbench owner=<host>:<pid> run=<run id>`: who may cancel this job when it is stale;
    the user's own comment (`--comment` in the salloc words) follows after "; ", so that one
    comment says both."""
    tag = f"{COMMENT_PREFIX}{owner} run={run_id}"
    return f"{tag}; {user_comment}" if user_comment else tag


def comment_owner(comment: str) -> str | None:
    """The `<host>:<pid>` of a comment written by `job_comment`, else None."""
    if not comment.startswith(COMMENT_PREFIX):
        return None
    return comment[len(COMMENT_PREFIX):].split()[0] if comment[len(COMMENT_PREFIX):] else None


def salloc_argv(settings: SlurmSettings, *, name: str, comment: str, nodes: int,
                gpus_per_node: int) -> tuple[str, ...]:
    """`salloc --no-shell` for one server node: it returns once the nodes are granted."""
    argv = ["salloc", "--no-shell", f"--job-name={name}", f"--comment={comment}",
            f"--nodes={nodes}"]
    given = (("partition", settings.partition), ("account", settings.account),
             ("time", settings.time))
    argv += [f"--{flag}={value}" for flag, value in given if value]
    if settings.exclusive:
        argv.append("--exclusive")
    if settings.gres and gpus_per_node > 0:
        argv.append(f"--gres={settings.gres}:{gpus_per_node}")
    return (*argv, *settings.args)


def srun_argv(job_id: str, host: str, server_argv: Sequence[str], *,
              container: Sequence[str] = (), extra: Sequence[str] = ()) -> tuple[str, ...]:
    """One server process as its own step on `host` of the allocation.

    `--overlap` lets the steps of a multi-role server share a node's CPUs (Slurm otherwise
    holds a second step until the first ends); `--export=ALL` hands the step the environment
    srun was started with, so no variable value appears in this argv.
    """
    return ("srun", f"--jobid={job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={host}",
            "--overlap", "--export=ALL", *container, *extra, "--", *server_argv)


def scancel_argv(job_ids: Sequence[str], *, kill: bool = False) -> tuple[str, ...]:
    """Cancel jobs; `kill` sends SIGKILL to their steps first (an interrupted run has no time
    for Slurm's graceful KillWait)."""
    return ("scancel", "--quiet", *(("--signal=KILL",) if kill else ()), *job_ids)


def job_info_argv(job_id: str) -> tuple[str, ...]:
    return ("scontrol", "--oneliner", "show", "job", job_id)


def own_jobs_argv(user: str) -> tuple[str, ...]:
    return ("squeue", "--noheader", f"--user={user}", "--format=%i|%j|%T|%k")


def job_marks_argv(job_id: str) -> tuple[str, ...]:
    """The name and comment Slurm holds for the job: `<name>|<comment>`."""
    return ("squeue", "--noheader", f"--jobs={job_id}", "--format=%j|%k")


def hostnames_argv(nodelist: str) -> tuple[str, ...]:
    return ("scontrol", "show", "hostnames", nodelist)


GRANTED = re.compile(r"Granted job allocation (\d+)")
PENDING = re.compile(r"(?:Pending|Granted) job allocation (\d+)")


def granted_job_id(salloc_output: str) -> str | None:
    match = GRANTED.search(salloc_output)
    return match.group(1) if match else None


def announced_job_id(salloc_output: str) -> str | None:
    """The job id salloc prints first ("Pending job allocation N"), before it is granted."""
    match = PENDING.search(salloc_output)
    return match.group(1) if match else None


@dataclass(frozen=True)
class JobInfo:
    """What `scontrol show job` says about one allocation."""

    job_id: str
    state: str  # RUNNING, TIMEOUT, CANCELLED, PREEMPTED, NODE_FAIL, ... ("" when unknown)
    reason: str  # Slurm's reason field: TimeLimit, None, ...
    nodelist: str
    exit_code: str = ""

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def describe(self) -> str:
        if not self.state:
            return f"slurm job {self.job_id} is no longer known to slurmctld"
        reason = f", reason {self.reason}" if self.reason and self.reason != "None" else ""
        return f"slurm job {self.job_id} {self.state}{reason}"


def parse_job_info(job_id: str, text: str) -> JobInfo:
    """`scontrol --oneliner show job` output -> JobInfo (state "" when the job is unknown)."""
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    state = fields.get("JobState", "")
    return JobInfo(job_id=job_id, state=state, reason=fields.get("Reason", ""),
                   nodelist=fields.get("NodeList", ""), exit_code=fields.get("ExitCode", ""))


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    name: str
    state: str
    comment: str


def parse_own_jobs(text: str) -> list[QueuedJob]:
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|", 3)
        if len(parts) == 4 and parts[0]:
            jobs.append(QueuedJob(*parts))
    return jobs
