"""Keep the client on one CPU while it measures, off the CPUs a local server is bound to.

A server on the same host wakes the client through the loopback socket, and Linux tends to
run the woken task on the waker's CPU: the client then waited for the server to finish
sending a whole engine step to all its streams before it could stamp any chunk. On the
2-core test machine, at concurrency 64 against the simulator, that made chunk stamps 1-2 ms
late for the first streams of each step (0.07 ms p50 once pinned) and moved the per-token
ITL median by 1-2%. Pinned, the client cannot be pulled onto the server's CPU; the server,
free to move, is balanced away from it.

A server process that is not free to move (vLLM's CPU backend binds its worker to CPU 0) must
not get the client pinned onto its CPU: the client takes a CPU none of the local server's
processes is bound to, or stays unpinned when there is none. A server this run did not start
(external, or a container on the host network) is found by the loopback port it listens on.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from collections.abc import Iterator


@dataclass(frozen=True)
class Pinning:
    """The CPU the client runs on while it measures (None: not pinned) and why."""

    cpu: int | None
    choice: str
    server_cpus: tuple[int, ...] = ()  # CPUs a local server's processes are bound to


def current_cpu() -> int | None:
    """The CPU this process last ran on (Linux /proc), or None."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return int(fields[36])  # field 39 of proc(5), counted after "pid (comm)"
    except (OSError, IndexError, ValueError):
        return None


def server_bound_cpus(leader: int, allowed: set[int],
                      proc: Path = Path("/proc")) -> frozenset[int]:
    """The CPUs of `allowed` that the processes of the server's process group (`leader`'s
    group: the server and everything it started) are bound to. A process whose affinity
    covers `allowed` is not bound: the scheduler moves it away from the pinned client."""
    bound: set[int] = set()
    for pid in _group_members(leader, proc):
        try:
            cpus = os.sched_getaffinity(pid)
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if not allowed <= cpus:
            bound |= cpus & allowed
    return frozenset(bound)


def _group_members(leader: int, proc: Path) -> list[int]:
    members = [leader]
    for entry in _pids(proc):
        if int(entry.name) != leader and _pgrp(entry) == leader:
            members.append(int(entry.name))
    return members


TCP_LISTEN = "0A"  # the st column of /proc/net/tcp: TCP_LISTEN


def is_local(base_url: str) -> bool:
    """Does the URL name this host (localhost, a loopback address)? The one answer for the
    client's CPU placement and for sampling the host's GPU power."""
    host = urlsplit(base_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_server_group(base_url: str, proc: Path = Path("/proc")) -> int | None:
    """The process group of the process listening on `base_url`'s port when the URL is this
    host's loopback, else None (a remote server, or a listener not visible in `proc`), and
    None when that group is the client's own (a server in this process or started without a
    group of its own: its processes cannot be told from the client's and its xdist siblings')."""
    if not is_local(base_url):
        return None
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    inodes = _listening_inodes(port, proc)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for entry in _pids(proc):
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in wanted:
                        group = _pgrp(entry)
                        return None if group == os.getpgrp() else group
    return None


def _listening_inodes(port: int, proc: Path) -> set[str]:
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (proc / "net" / table).read_text(encoding="ascii").splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == TCP_LISTEN \
                        and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    return inodes


def _pids(proc: Path) -> list[Path]:
    try:
        return [entry for entry in proc.iterdir() if entry.name.isdigit()]
    except OSError:
        return []


def _pgrp(entry: Path) -> int | None:
    try:
        fields = (entry / "stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
        return int(fields[2])  # field 5 of proc(5): pgrp
    except (OSError, IndexError, ValueError):
        return None


def chosen_cpu(allowed: set[int], avoid: frozenset[int] = frozenset()) -> int | None:
    """One of `allowed` not in `avoid`: xdist worker N takes the N-th (so workers do not share
    one); a lone process keeps the CPU it is on, or takes the lowest free one."""
    free = allowed - avoid
    if not free:
        return None
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        return sorted(free)[int(worker[2:]) % len(free)]
    cpu = current_cpu()
    return cpu if cpu in free else min(free)


@contextlib.contextmanager
def pinned_to_one_cpu(server_pid: int | None = None) -> Iterator[Pinning]:
    """Pin this process to one CPU (`chosen_cpu`) that the local server whose process group
    `server_pid` leads is not bound to, restoring its affinity after; yields the `Pinning`,
    its cpu None where pinning is not possible, pointless (one CPU) or unavoidably onto the
    server's CPUs."""
    get = getattr(os, "sched_getaffinity", None)
    set_ = getattr(os, "sched_setaffinity", None)
    if get is None or set_ is None:
        yield Pinning(None, "not pinned: no CPU affinity on this platform")
        return
    allowed = get(0)
    if len(allowed) < 2:
        yield Pinning(None, "not pinned: one CPU")
        return
    avoid = frozenset() if server_pid is None else server_bound_cpus(server_pid, allowed)
    server_cpus = tuple(sorted(avoid))
    cpu = chosen_cpu(allowed, avoid)
    if cpu is None:
        yield Pinning(None, f"not pinned: the local server is bound to CPUs {list(server_cpus)}, "
                      "every CPU this client may use", server_cpus)
        return
    try:
        set_(0, {cpu})
    except OSError as exc:
        yield Pinning(None, f"not pinned: {exc}", server_cpus)
        return
    where = ("server CPUs unknown (not a process of this host)" if server_pid is None
             else f"off the local server's bound CPUs {list(server_cpus)}" if server_cpus
             else "the local server is bound to no CPU")
    try:
        yield Pinning(cpu, f"pinned to CPU {cpu}: {where}", server_cpus)
    finally:
        with contextlib.suppress(OSError):
            set_(0, allowed)
