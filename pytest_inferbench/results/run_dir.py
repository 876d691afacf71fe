"""The results directory belongs to one run.

When the run starts (after collection, controller only, before any server starts):

- temporary files of JSON writers that died mid-write (`.<name>.<pid>.<random>.tmp`, written by
  `results.write_json_atomic`) are removed when their writer is gone;
- a results directory that holds anything else is an earlier run's: it is moved aside to
  `<dir>.<its run id or time>` (never deleted, never mixed with this run's files) and the
  terminal says where;
- `run.json` records this run's id, host, pid and start time; every result carries the id too.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

from ..util.pids import pid_alive

RUN_FILE = "run.json"
_TMP = re.compile(r"^\..+\.(\d+)\.[^.]+\.tmp$")


def remove_stale_temp_files(directory: Path) -> list[str]:
    """Temp files whose writer (the pid in their name) is gone; one line when any went."""
    if not directory.is_dir():
        return []
    removed = 0
    for path in directory.rglob(".*.tmp"):
        found = _TMP.match(path.name)
        if found and not pid_alive(int(found.group(1))) and path.is_file():
            path.unlink(missing_ok=True)
            removed += 1
    return [f"removed {removed} temporary file(s) left by a writer that was killed "
            f"mid-write in {directory}"] if removed else []


def earlier_run_id(directory: Path) -> str | None:
    try:
        data = json.loads((directory / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    run_id = data.get("run_id") if isinstance(data, dict) else None
    return str(run_id) if run_id else None


def move_earlier_run_aside(directory: Path) -> list[str]:
    """A non-empty results directory moved to a free sibling name; one line saying where."""
    if not directory.is_dir() or not any(directory.iterdir()):
        return []
    run_id = earlier_run_id(directory)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(directory.stat().st_mtime))
    suffix = run_id or stamp
    target = directory.with_name(f"{directory.name}.{suffix}")
    n = 1
    while target.exists():
        n += 1
        target = directory.with_name(f"{directory.name}.{suffix}-{n}")
    directory.rename(target)
    what = f"run {run_id}" if run_id else f"a run of {stamp}"
    return [f"{directory} held the results of {what}: moved aside to {target}, so this run's "
            "results are not mixed with them"]


def prepare(directory: Path, run_id: str) -> list[str]:
    """The session-start steps above; lines for the terminal."""
    lines = remove_stale_temp_files(directory)
    lines += move_earlier_run_aside(directory)
    directory.mkdir(parents=True, exist_ok=True)
    record = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (directory / RUN_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return lines
