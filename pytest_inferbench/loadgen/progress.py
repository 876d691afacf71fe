"""Progress of a running point: a live line on a terminal, periodic lines elsewhere (CI).

On a terminal it redraws at most every `refresh_s` from its own task, so per-request
bookkeeping stays a counter update; the text is drawn to the right of the cursor and wiped when
the point ends. Without one, `ProgressOutput.emit` gets one line every `interval_s` (requests
done, rate, ETA); the line of each finished point is `report.live`'s.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from ..util.aio import cancel_and_wait

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..results.metrics import RequestRecord

REFRESH_S = 0.5
LINE_INTERVAL_S = 30.0  # CI logs: often enough to see a point move, rare enough to read
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


@dataclass(frozen=True)
class ProgressOutput:
    """Where a point's progress goes: a terminal's live line, or periodic lines, or nowhere."""

    live: TextIO | None = None
    emit: Callable[[str], None] | None = None
    interval_s: float = LINE_INTERVAL_S


def default_output() -> ProgressOutput:
    """The live line when there is a terminal (callers outside a pytest run)."""
    return ProgressOutput(live=terminal_stream())


class Progress:
    def __init__(self, label: str, total: int, stream: TextIO | None = None,
                 refresh_s: float = REFRESH_S, emit: Callable[[str], None] | None = None,
                 interval_s: float = LINE_INTERVAL_S) -> None:
        self.label = label
        self.total = total
        self.stream = stream
        self.refresh_s = refresh_s
        self.emit = emit if stream is None else None  # a terminal gets the live line only
        self.interval_s = interval_s
        self.done = 0
        self.failed = 0
        self.output_tokens = 0
        self.chunks = 0  # reads of running streams, counted live
        self.finished_chunks = 0
        self._start = time.perf_counter()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def to(cls, output: ProgressOutput, label: str, total: int) -> Progress:
        return cls(label, total, output.live, emit=output.emit, interval_s=output.interval_s)

    @property
    def enabled(self) -> bool:
        return self.stream is not None or self.emit is not None

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
        requests_per_s = self.done / elapsed if elapsed > 0 else 0.0
        # Requests left at the rate so far; unknown until the first one finished.
        eta = (f"ETA {(self.total - self.done) / requests_per_s:.0f} s" if requests_per_s > 0
               else "ETA ?")
        return (f"{self.label}: {self.done}/{self.total} requests{failed}, {elapsed:.0f} s, "
                f"{requests_per_s:.2f} req/s, ~{rate:,.0f} output tok/s, {eta}")

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

    async def _lines(self, emit: Callable[[str], None]) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            emit(self.line())

    def start(self) -> None:
        self._start = time.perf_counter()
        if self.stream is not None:
            self._task = asyncio.get_running_loop().create_task(self._refresh())
        elif self.emit is not None:
            self._task = asyncio.get_running_loop().create_task(self._lines(self.emit))

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._draw("")  # nothing when drawing to no terminal
