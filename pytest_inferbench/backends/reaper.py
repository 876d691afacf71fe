"""Nothing outlives the run: idempotent stops, SIGTERM -> KeyboardInterrupt, stale sweeps.

- `stop_container` / `stop_process_group`: graceful, then kill, then remove; every step
  tolerates "already gone", so a second call or a call after a half-done start is harmless.
- `install_sigterm_handler` / `restore_sigterm_handler`: pytest runs no teardown on SIGTERM
  (CI cancel, `timeout`); mapping it to KeyboardInterrupt makes pytest unwind normally, so
  every ServerNode teardown runs. `plugin/activation.py` installs it when a run uses the plugin and
  keeps the handler it replaced in the config stash, to restore at unconfigure.
- `sweep_stale_containers`: containers carry `inferbench.owner=<host>:<pid>` of the process that
  started them; when the run starts (controller only) those whose owner on this host is dead are
  removed. Containers of other live runs sharing the engine are left alone.
- `sweep_stale_processes`: local servers (process, sim-server) carry `INFERBENCH_OWNER=<host>:<pid>`
  in their environment, inherited by every process they start; when the run starts those whose
  owner on this host is dead (a SIGKILLed pytest ran no teardown) are killed.
- `make_client`: a Docker Engine client (the docker backend's and the sweep's).
- `stop_all_tracked`: an atexit safety net for handles whose teardown never ran (registered
  with the first tracked handle, so a run that starts no server leaves atexit alone).

A signal and atexit are process-wide, so the interrupted flag and the tracked handles are too.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Union

from ..util.pids import pid_alive

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from types import FrameType

    from docker import DockerClient
    from docker.models.containers import Container

    from ..options import Settings

# What signal.getsignal() returns: a handler, SIG_DFL / SIG_IGN, or None (set outside Python).
SignalHandler = Union["Callable[[int, FrameType | None], object]", int, signal.Handlers, None]

LABEL_RUN = "inferbench.run"
LABEL_WORKER = "inferbench.worker"
LABEL_NODE = "inferbench.node"
LABEL_OWNER = "inferbench.owner"

GRACE_S = 10.0
# Under xdist the controller kills workers ~10 s into shutdown; an interrupted run must not
# spend that on graceful stops, so teardown after an interrupt kills at once.
INTERRUPTED_GRACE_S = 0.0


# The environment variable that marks a local server and all its children with their owner.
OWNER_ENV = "INFERBENCH_OWNER"


def owner_label() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _docker_errors() -> tuple[type[BaseException], ...]:
    import docker.errors
    import requests.exceptions

    return (docker.errors.NotFound, docker.errors.APIError, requests.exceptions.ConnectionError)


def stop_container(container: Container, grace_s: float = GRACE_S) -> None:
    """Stop (SIGTERM, then SIGKILL after grace_s) and remove; no error if already gone."""
    grace_s = INTERRUPTED_GRACE_S if _interrupted.is_set() else grace_s
    errors = _docker_errors()
    with contextlib.suppress(*errors):
        if grace_s > 0:
            container.stop(timeout=max(1, round(grace_s)))
        else:
            container.kill()
    with contextlib.suppress(*errors):
        container.remove(force=True, v=True)


@contextlib.contextmanager
def sigint_held() -> Iterator[None]:
    """A Ctrl-C during the block is raised when it ends, not inside it: a server started in the
    block (Popen waits for its exec) is tracked before the KeyboardInterrupt unwinds, instead of
    running on with no one holding it. Only the main thread receives signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(signal.SIGINT, None)  # Python's handler: raises KeyboardInterrupt here


def start_in_own_group(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Run argv in a process group of its own (stdin empty, stdout and stderr on one pipe), in
    this process's session, for `stop_process_group` to kill whole.

    Not a new session: with the scheduler's autogroups (Linux
    /proc/sys/kernel/sched_autogroup_enabled) a session is a CPU group of its own, weighted like
    the whole of this run, so a busy local server and the load client would share the CPUs as
    two equal groups whatever else runs, and the client stalls. A Ctrl-C at the terminal still
    reaches only the foreground group (this run), whose teardown stops the server.
    """
    if sys.version_info >= (3, 11):
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, process_group=0)
    # setpgid(0, 0) in the child before exec: what process_group=0 does on 3.11+.
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, preexec_fn=os.setpgrp)


def stop_process_group(process: subprocess.Popen[bytes], grace_s: float = GRACE_S) -> None:
    """SIGTERM the process group, SIGKILL it after grace_s; reaps the leader."""
    grace_s = INTERRUPTED_GRACE_S if _interrupted.is_set() else grace_s
    if process.poll() is None and grace_s > 0:
        _signal_group(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace_s)
    # Children of the leader may still run even when the leader has exited.
    _signal_group(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5.0)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


# --- SIGTERM -------------------------------------------------------------------------------

_interrupted = threading.Event()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _interrupted.set()
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def install_sigterm_handler() -> list[SignalHandler]:
    """Map SIGTERM to KeyboardInterrupt (main thread only).

    Returns the replaced handler, as a one-item list, for `restore_sigterm_handler`; an empty
    list when nothing was installed (not the main thread, or ours is already in place).
    """
    _interrupted.clear()  # a new session (pytester runs several in one process)
    if threading.current_thread() is not threading.main_thread():
        return []
    previous = signal.getsignal(signal.SIGTERM)
    if previous is _on_sigterm:
        return []
    signal.signal(signal.SIGTERM, _on_sigterm)
    return [previous]


def restore_sigterm_handler(previous: SignalHandler) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def interrupted() -> bool:
    """Has this run been interrupted (Ctrl-C, SIGTERM, interpreter exit)?"""
    return _interrupted.is_set()


def mark_interrupted() -> None:
    """For pytest_keyboard_interrupt: later stops kill at once instead of waiting."""
    _interrupted.set()


# --- tracked handles (atexit safety net) ---------------------------------------------------

_tracked: dict[int, Callable[[], None]] = {}
_tracked_lock = threading.Lock()
_atexit_registered = threading.Event()


def track(key: object, stop: Callable[[], None]) -> None:
    with _tracked_lock:
        _tracked[id(key)] = stop
        if not _atexit_registered.is_set():
            _atexit_registered.set()
            atexit.register(stop_all_tracked)


def untrack(key: object) -> None:
    with _tracked_lock:
        _tracked.pop(id(key), None)


def stop_all_tracked() -> None:
    _interrupted.set()
    with _tracked_lock:
        stops = list(_tracked.values())
        _tracked.clear()
    for stop in stops:
        with contextlib.suppress(Exception):
            stop()


# --- stale containers ----------------------------------------------------------------------

def is_stale(labels: dict[str, str], hostname: str | None = None) -> bool:
    host, _, pid = labels.get(LABEL_OWNER, "").rpartition(":")
    if host != (hostname or socket.gethostname()) or not pid.isdigit():
        return False  # started elsewhere: we cannot tell whether its owner lives
    return not pid_alive(int(pid))


def sweep_client(client: DockerClient) -> list[str]:
    """Remove this host's inferbench containers whose owning process is gone; their names."""
    removed = []
    for container in client.containers.list(all=True, filters={"label": LABEL_OWNER}):
        if is_stale(container.labels):
            stop_container(container, grace_s=0)
            removed.append(container.name)
    return removed


def make_client(host: str | None) -> DockerClient:
    """A client for `host` (tcp://, unix://, ssh://) or, when None, DOCKER_HOST / the socket."""
    import docker

    client = docker.DockerClient(base_url=host) if host else docker.from_env()
    client.ping()
    return client


def sweep_stale_containers(settings: Settings) -> list[str]:
    """Session start, controller only: sweep every engine this run will use (docker backend).

    Returns one line per removed container (for the terminal); nothing when the backend is
    not docker or no engine answers (the backend reports that itself, with context).
    """
    if settings.backend != "docker":
        return []
    hosts: list[str | None] = [*settings.docker_hosts] or [settings.docker_host]
    lines = []
    for host in hosts:
        try:
            client = make_client(host)
        except Exception:
            continue
        try:
            lines += [f"removed stale container {name} ({host or 'local engine'})"
                      for name in sweep_client(client)]
        finally:
            client.close()
    return lines


# --- stale local server processes ----------------------------------------------------------

def sweep_stale_processes(proc: Path = Path("/proc")) -> list[str]:
    """Kill this host's processes marked `INFERBENCH_OWNER=<host>:<pid>` whose owner is dead;
    one line per process. Only processes this user may read are seen (and may be killed)."""
    if not proc.is_dir():
        return []  # no /proc (not Linux): nothing to find
    marker = f"{OWNER_ENV}=".encode()
    lines = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            variables = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        owner = next((v[len(marker):].decode(errors="replace") for v in variables
                      if v.startswith(marker)), None)
        if owner is None or not is_stale({LABEL_OWNER: owner}):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(entry.name), signal.SIGKILL)
            lines.append(f"killed stale server process {entry.name} (started by {owner}, "
                         "which is gone)")
    return lines
