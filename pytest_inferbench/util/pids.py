"""Whether a process of this host still runs: the one check behind every "its owner is gone"
decision (stale containers and local servers, temporary files of dead writers)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while `pid` exists, also when it belongs to another user (we may not signal it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
