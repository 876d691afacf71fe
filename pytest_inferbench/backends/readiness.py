"""Server logs to a file from the first byte, and the wait until a server is ready.

Shared by the docker and process backends. Readiness polls the health URL *and* the server's
own state (container status / process exit) together, so a server that crashes while loading
fails at once with its exit code instead of after the whole startup timeout; HTTP-only waits
don't notice that.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import httpx

from ..results.file_names import bounded
from .base import MAIN_WORKER, ServerStartError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ..results.redact import Redactor

TAIL_LINES = 40
HEALTH_REQUEST_TIMEOUT_S = 2.0
# Every response of the simulated server carries this header; a handle serving it, even in a
# container or behind an external URL, must report its numbers as simulated.
SIMULATED_HEADER = "x-inferbench-simulated"
TIME_SCALE_HEADER = "x-inferbench-time-scale"


class LogPump:
    """Copies a byte stream (container logs, process stdout) line by line to a file.

    Secret values are redacted before a line reaches the disk; the last lines stay in memory
    for error messages, so a failure never re-reads a long log. A log file that cannot be
    written (a full disk) costs the file, never the server: the stream is still read to its
    end (a server whose output pipe fills up stalls), and the lines kept in memory say why the
    file stops.
    """

    def __init__(self, chunks: Iterable[bytes], path: Path, redactor: Redactor,
                 keep_lines: int = 200) -> None:
        self.path = path
        self._chunks = chunks
        self._redactor = redactor
        self._tail: deque[str] = deque(maxlen=keep_lines)
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self._lost_note: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("w", encoding="utf-8")
        except OSError as exc:
            self._lost(exc)
        self._thread = threading.Thread(target=self._run, name=f"log-{path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pending = b""
        try:
            for chunk in self._chunks:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._write(line)
        except Exception as exc:  # the stream closes under us when the server is removed
            self._write(f"[inferbench] log stream ended: {type(exc).__name__}".encode())
        finally:
            if pending:
                self._write(pending)
            with self._lock:
                self._close()

    def _write(self, raw: bytes) -> None:
        line = self._redactor.text(raw.decode("utf-8", "replace").rstrip("\r"))
        with self._lock:
            self._tail.append(line)
            if self._file is not None:
                try:
                    self._file.write(line + "\n")
                    self._file.flush()
                except OSError as exc:
                    self._lost(exc)

    def _lost(self, exc: OSError) -> None:
        """The file cannot be written: closed, and a line that says so heads every tail."""
        self._close()
        self._lost_note = (f"[inferbench] cannot write the server log {self.path}: "
                           f"{exc.strerror or exc}; its last lines are kept in memory only")

    def _close(self) -> None:
        handle, self._file = self._file, None
        # What it still held could not be written either.
        with contextlib.suppress(OSError):
            if handle is not None:
                handle.close()

    def tail(self, lines: int = TAIL_LINES) -> str:
        with self._lock:
            kept = list(self._tail)[-lines:]
            return "\n".join([self._lost_note, *kept] if self._lost_note else kept)

    def join(self, timeout_s: float = 5.0) -> None:
        """Wait for the stream to end (after the server stopped) so the file is complete."""
        self._thread.join(timeout_s)


@dataclass(frozen=True)
class ReadinessProbe:
    """What the wait needs to know about one starting server."""

    name: str  # the node, for messages
    health_url: str
    exit_code: Callable[[], int | None]  # None while the server still runs
    log_tail: Callable[[], str]
    log_path: Path
    exit_detail: Callable[[], str] = str  # why it exited, beyond the code ("" by default)


@dataclass(frozen=True)
class Ready:
    seconds: float  # from the start of the wait until the first 200
    simulated: bool  # the server marks itself as the simulator (SIMULATED_HEADER)
    time_scale: float | None  # the simulator's clock (TIME_SCALE_HEADER); None: a real server


def says_simulated(headers: httpx.Headers) -> bool:
    return str(headers.get(SIMULATED_HEADER, "")).lower() == "true"


def announced_time_scale(headers: httpx.Headers) -> float | None:
    """The simulator's clock scale from its header; None when the server names none."""
    try:
        return float(headers[TIME_SCALE_HEADER])
    except (KeyError, ValueError):
        return None


def keeps_real_time(headers: httpx.Headers) -> bool:
    """Only the simulator can stream on no clock at all; it says so in a header."""
    return announced_time_scale(headers) != 0


def wait_until_ready(probe: ReadinessProbe, timeout_s: float, poll_s: float = 0.25) -> Ready:
    """Block until the health URL answers 200.

    Raises ServerStartError with the exit code (when the server exited) or the last health
    error (on timeout), plus the last log lines, so the node's setup error says why.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    last_error = "no answer yet"
    with httpx.Client(trust_env=False, timeout=HEALTH_REQUEST_TIMEOUT_S) as client:
        while True:
            code = probe.exit_code()
            if code is not None:
                raise ServerStartError(_message(
                    probe, f"exited with code {code}{_detail(probe)} before it became ready "
                    f"({time.monotonic() - started:.1f}s after start)"))
            try:
                response = client.get(probe.health_url)
                if response.status_code == 200:
                    return Ready(time.monotonic() - started, says_simulated(response.headers),
                                 announced_time_scale(response.headers))
                last_error = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if time.monotonic() >= deadline:
                code = probe.exit_code()  # it may have died during the last poll
                reason = (f"exited with code {code}{_detail(probe)}" if code is not None else
                          f"not ready after {timeout_s:g}s (last health check "
                          f"{probe.health_url}: {last_error})")
                raise ServerStartError(_message(probe, reason))
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
            poll_s = min(poll_s * 1.5, 2.0)


def _detail(probe: ReadinessProbe) -> str:
    detail = probe.exit_detail()
    return f" ({detail})" if detail else ""


def _message(probe: ReadinessProbe, reason: str) -> str:
    return (f"server {probe.name} {reason}; log {probe.log_path}\n"
            f"--- last log lines ---\n{probe.log_tail() or '(empty)'}")


def startup_timeout(spec_timeout_s: float, override_s: float | None) -> float:
    return override_s if override_s is not None else spec_timeout_s


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the server binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_path_for(results_dir: Path, node: str, worker_id: str, taken: set[Path]) -> Path:
    """`<results>/server-logs/<node>.<worker>.log` under xdist (`<node>.log` without), not
    one of `taken` (the session's `StartContext.log_paths`), which it joins."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", node).strip("_") or "server"
    # The worker id is a part of the name, not a suffix to replace: an xdist run's workers
    # write into one folder, each its own server's log.
    base = bounded(slug if worker_id == MAIN_WORKER else f"{slug}.{worker_id}")
    path = results_dir / "server-logs" / f"{base}.log"
    counter = 2
    while path in taken:
        path = results_dir / "server-logs" / f"{base}-{counter}.log"
        counter += 1
    taken.add(path)
    return path
