"""A live status line for a running point: on a terminal only, quiet otherwise.

It redraws at most every `refresh_s` from its own task, so per-request bookkeeping stays a
counter update; the text is drawn to the right of the cursor and wiped when the point ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from ..metrics import RequestRecord

REFRESH_S = 0.5
SAVE_CURSOR, RESTORE_CURSOR, CLEAR_TO_EOL = "\x1b7", "\x1b8", "\x1b[K"


_TERMINAL: list[TextIO | None] = []  # opened once per process


def terminal_stream() -> TextIO | None:
    """The controlling terminal, or None: no terminal, or an xdist worker (many would draw).

    pytest captures file descriptors 1 and 2 during a test, so the line goes to /dev/tty.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    if not _TERMINAL:
        try:
            tty: TextIO | None = open("/dev/tty", "w")  # noqa: SIM115 - kept for the process
        except OSError:
            tty = None
        if tty is not None and not tty.isatty():
            tty.close()
            tty = None
        _TERMINAL.append(tty)
    return _TERMINAL[0]


class Progress:
    def __init__(self, label: str, total: int, stream: TextIO | None = None,
                 refresh_s: float = REFRESH_S) -> None:
        self.label = label
        self.total = total
        self.stream = stream
        self.refresh_s = refresh_s
        self.done = 0
        self.failed = 0
        self.output_tokens = 0
        self.chunks = 0  # reads of running streams, counted live
        self.finished_chunks = 0
        self._start = time.perf_counter()
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.stream is not None

    def on_record(self, record: RequestRecord) -> None:
        self.done += 1
        self.failed += 0 if record.success else 1
        if record.success:
            self.output_tokens += record.output_tokens
            self.finished_chunks += len(record.chunk_times)

    def on_read(self) -> None:
        self.chunks += 1

    def line(self) -> str:
        elapsed = time.perf_counter() - self._start
        # Live chunks times the tokens per chunk of the finished requests (1 before any).
        per_chunk = self.output_tokens / self.finished_chunks if self.finished_chunks else 1.0
        rate = self.chunks * per_chunk / elapsed if elapsed > 0 else 0.0
        failed = f", {self.failed} failed" if self.failed else ""
        return (f"{self.label}: {self.done}/{self.total} requests{failed}, {elapsed:.0f} s, "
                f"~{rate:,.0f} output tok/s")

    def _draw(self, text: str) -> None:
        # Drawn after the cursor (pytest's own progress text), which is saved and restored:
        # pytest keeps writing where it was and nothing of its line is lost.
        if self.stream is not None:
            self.stream.write(f"{SAVE_CURSOR}{' ' + text if text else ''}{CLEAR_TO_EOL}"
                              f"{RESTORE_CURSOR}")
            self.stream.flush()

    async def _refresh(self) -> None:
        while True:
            self._draw(self.line())
            await asyncio.sleep(self.refresh_s)

    def start(self) -> None:
        self._start = time.perf_counter()
        if self.enabled:
            self._task = asyncio.get_running_loop().create_task(self._refresh())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._draw("")
