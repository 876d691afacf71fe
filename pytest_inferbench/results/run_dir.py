"""The results directory belongs to one run, and only a directory the plugin made is ever moved.

When the run starts (after collection, controller only, before any server starts):

- a directory that is not the plugin's is refused, never touched: one that holds files but no
  `run.json` (a project, a recipe folder, someone's data), and one that holds the directory
  pytest runs in (moving it would move the project);
- a directory another live run holds (its lock, `.inferbench.lock`, taken with `flock`) is
  refused: that run would go on writing into this run's directory;
- temporary files of writers that died mid-write (`.<name>.<pid>.<random>.tmp`, written by
  `build.write_text_atomic`) are removed when their writer is gone;
- an earlier run's directory is moved aside to `<dir>.<its run id or time>` (never deleted,
  never mixed with this run's files) and the terminal says where;
- only the newest `keep` of the directories moved aside are kept: an older one is removed when
  both its name (`<dir>.<run id>`, as moved aside above) and the `run.json` inside it (the same
  run id) say that the plugin made it; any other sibling is never touched;
- `run.json` records this run's id, host, pid and start time (the mark that the directory is
  the plugin's; every result carries the id too), a `.gitignore` keeps the directory out of
  git, and this run takes the lock until it ends.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..util.pids import pid_alive

if TYPE_CHECKING:
    from collections.abc import Iterable

RUN_FILE = "run.json"
LOCK_FILE = ".inferbench.lock"
GITIGNORE = ".gitignore"
KEEP_RUNS = 3  # earlier runs' directories kept beside the results directory by default
# A run id as `state` makes them (uuid4 hex, 12 digits), with the `-N` of a name already taken.
_MOVED_SUFFIX = re.compile(r"^(?P<run_id>[0-9a-f]{12})(?:-\d+)?$")
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


def moved_aside_runs(directory: Path) -> list[Path]:
    """The earlier runs' directories the plugin moved aside from `directory`, newest first:
    a sibling counts only when its name and its `run.json` name the same run."""
    if not directory.parent.is_dir():
        return []
    found: list[tuple[float, Path]] = []
    prefix = directory.name + "."
    for sibling in directory.parent.iterdir():
        if not sibling.name.startswith(prefix) or sibling.is_symlink() or not sibling.is_dir():
            continue
        named = _MOVED_SUFFIX.match(sibling.name[len(prefix):])
        if named is None or earlier_run_id(sibling) != named.group("run_id"):
            continue
        found.append(((sibling / RUN_FILE).stat().st_mtime, sibling))
    return [path for _, path in sorted(found, reverse=True)]


def remove_old_runs(directory: Path, keep: int) -> list[str]:
    """The moved-aside directories past the newest `keep` removed; one line when any went.
    One that a live run still holds (its lock) stays."""
    removed: list[Path] = []
    for old in moved_aside_runs(directory)[keep:]:
        lock = _try_lock(old / LOCK_FILE) if (old / LOCK_FILE).exists() else -1
        if lock is None:
            continue
        try:
            shutil.rmtree(old)
        except OSError:
            continue  # another run removing it too, or a file we may not remove: kept
        finally:
            if lock >= 0:
                os.close(lock)
        removed.append(old)
    if not removed:
        return []
    return [f"removed {len(removed)} earlier run(s) beside {directory} "
            f"({', '.join(p.name for p in removed)}); the newest {keep} are kept "
            "(ini inferbench_keep_runs)"]


class ResultsDirError(Exception):
    """The results directory cannot be this run's; the message says why and what to pass."""


def refusal(directory: Path, protected: Iterable[Path]) -> str | None:
    """Why `directory` is not the plugin's to use, or None. `protected`: directories it must
    not hold (where pytest runs, its rootdir), whatever they hold."""
    resolved = directory.resolve()
    for kept in protected:
        if resolved == kept.resolve() or resolved in kept.resolve().parents:
            return (f"{directory} holds {kept}, where this pytest run works; a results "
                    "directory is moved aside by the next run")
    if not directory.is_dir():
        return None
    names = sorted(p.name for p in directory.iterdir() if p.name != LOCK_FILE)
    if names and earlier_run_id(directory) is None:
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        return (f"{directory} holds files that no inferbench run wrote ({shown}): the plugin "
                "moves aside only results directories it made")
    return None


def _try_lock(path: Path) -> int | None:
    """An open descriptor holding an exclusive lock on `path`, or None when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
            return None
        raise
    return fd


def _holder(directory: Path) -> str:
    try:
        data = json.loads((directory / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        return "another run"
    return (f"run {data.get('run_id')} (pid {data.get('pid')} on {data.get('host')}, started "
            f"{data.get('started')})")


def prepare(directory: Path, run_id: str, protected: Iterable[Path],
            keep: int = KEEP_RUNS) -> tuple[list[str], int]:
    """The session-start steps above: lines for the terminal, and the descriptor that holds
    the directory's lock until the run ends (`release`). Raises `ResultsDirError`."""
    reason = refusal(directory, protected)
    if reason is not None:
        raise ResultsDirError(f"{reason}; pass an empty or new directory to "
                              "--inferbench-results")
    # An earlier run's lock file: free (its run ended) or held (its run is live).
    earlier = _try_lock(directory / LOCK_FILE) if (directory / LOCK_FILE).exists() else -1
    if earlier is None:
        raise ResultsDirError(
            f"{directory} is in use by {_holder(directory)}, which writes its results there; "
            "wait for it to end or pass another directory to --inferbench-results")
    try:
        lines = remove_stale_temp_files(directory)
        lines += move_earlier_run_aside(directory)
    finally:
        if earlier >= 0:
            os.close(earlier)
    # With the earlier lock closed: the run just moved aside is not mistaken for a live one.
    lines += remove_old_runs(directory, keep)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = _try_lock(directory / LOCK_FILE)
    except OSError as exc:
        raise ResultsDirError(f"cannot write {directory}: {exc.strerror or exc}") from None
    if lock is None:  # another run made the directory anew between our steps
        raise ResultsDirError(f"{directory} was taken by {_holder(directory)} as this run "
                              "started; pass another directory to --inferbench-results")
    record = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        (directory / RUN_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        # After run.json: a directory holding files but no run.json is refused as not the plugin's.
        (directory / GITIGNORE).write_text("# results of a pytest-inferbench run\n*\n",
                                           encoding="utf-8")
    except OSError as exc:  # a full disk: nothing of this run could be kept
        # Half a run.json would mark the directory as no run's: the next run would refuse it.
        (directory / RUN_FILE).unlink(missing_ok=True)
        (directory / GITIGNORE).unlink(missing_ok=True)
        os.close(lock)
        raise ResultsDirError(f"cannot write {directory / RUN_FILE}: {exc.strerror or exc}; "
                              "free some space or pass another directory to "
                              "--inferbench-results") from None
    return lines, lock


def release(lock: int) -> None:
    """The run's end: the next run may take the directory."""
    os.close(lock)
