"""Keep the client on one CPU while it measures.

A server on the same host wakes the client through the loopback socket, and Linux tends to
run the woken task on the waker's CPU: the client then waited for the server to finish
sending a whole engine step to all its streams before it could stamp any chunk. On the
2-core test machine, at concurrency 64 against the simulator, that made chunk stamps 1-2 ms
late for the first streams of each step (0.07 ms p50 once pinned) and moved the per-token
ITL median by 1-2%. Pinned, the client cannot be pulled onto the server's CPU; the server,
free to move, is balanced away from it.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator


def current_cpu() -> int | None:
    """The CPU this process last ran on (Linux /proc), or None."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return int(fields[36])  # field 39 of proc(5), counted after "pid (comm)"
    except (OSError, IndexError, ValueError):
        return None


def chosen_cpu(allowed: set[int]) -> int | None:
    """xdist worker N takes the N-th allowed CPU (so workers do not share one); a lone
    process keeps the CPU it is on."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        return sorted(allowed)[int(worker[2:]) % len(allowed)]
    cpu = current_cpu()
    return cpu if cpu in allowed else None


@contextlib.contextmanager
def pinned_to_one_cpu() -> Iterator[int | None]:
    """Pin this process to one CPU (`chosen_cpu`), restoring its affinity after; yields the
    CPU, or None where pinning is not possible or pointless (one CPU, no affinity API)."""
    get = getattr(os, "sched_getaffinity", None)
    set_ = getattr(os, "sched_setaffinity", None)
    if get is None or set_ is None:
        yield None
        return
    allowed = get(0)
    cpu = chosen_cpu(allowed) if len(allowed) > 1 else None
    if cpu is None:
        yield None
        return
    try:
        set_(0, {cpu})
    except OSError:
        yield None
        return
    try:
        yield cpu
    finally:
        with contextlib.suppress(OSError):
            set_(0, allowed)
