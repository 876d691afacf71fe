"""One function per item in forked worker processes, a few at a time, each result yielded as it
ends.

A benchmark's node whose process dies (the kernel kills it for memory) ends as a line that says
so, and the run goes on in a new worker: `multiprocessing.Pool` waits forever for a task whose
worker was killed, as a whole agentic-matrix run once did for 40 minutes with both cores idle.
Workers are kept from item to item (a process per item paid each node's first-use costs again:
the 2973-point matrix took 41-44 s CPU that way against 29-30 s).
"""

from __future__ import annotations

import multiprocessing
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from multiprocessing.process import BaseProcess

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass(frozen=True)
class Outcome(Generic[Item, Result]):
    item: Item
    result: Result | None  # None when the process died first
    death: str = ""  # why it died: its exit code or the signal that ended it


def _worker(func: Callable[[Item], Result], channel: Connection) -> None:
    """Runs the items sent, each as `(True, item)`, until `(False, None)` or the parent's end
    is gone. (Not EOF alone: workers forked later hold copies of this one's parent end.)"""
    while True:
        try:
            more, item = channel.recv()
        except EOFError:
            return
        if not more:
            return
        channel.send(func(item))


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        hint = " (the kernel's out-of-memory killer sends it)" if name == "SIGKILL" else ""
        return f"its process ended by {name}{hint}"
    return f"its process exited with code {exitcode} without a result"


def run_each(func: Callable[[Item], Result], items: Sequence[Item], jobs: int
             ) -> Iterator[Outcome[Item, Result]]:
    """`func(item)` for each item, at most `jobs` at once, in forked worker processes (the
    parent's imports and data shared); outcomes in the order they end."""
    context = multiprocessing.get_context("fork")
    waiting = list(reversed(items))
    idle: list[tuple[BaseProcess, Connection]] = []
    running: dict[Connection, tuple[BaseProcess, Item]] = {}
    try:
        while waiting or running:
            while waiting and len(running) < max(jobs, 1):
                if idle:
                    process, channel = idle.pop()
                else:
                    channel, child_end = context.Pipe()
                    process = context.Process(target=_worker, args=(func, child_end),
                                              daemon=True)
                    process.start()
                    child_end.close()  # the child's: EOF here once the child is gone
                item = waiting.pop()
                channel.send((True, item))
                running[channel] = (process, item)
            for ready in wait(list(running)):
                assert isinstance(ready, Connection)
                process, item = running.pop(ready)
                try:
                    outcome: Outcome[Item, Result] = Outcome(item, ready.recv())
                except EOFError:
                    ready.close()
                    process.join()
                    yield Outcome(item, None, _death(process.exitcode))
                    continue
                idle.append((process, ready))
                yield outcome
    finally:
        for _, channel in idle:
            channel.send((False, None))
        for process, _ in running.values():  # still busy: the run was stopped early
            process.kill()
        for process, channel in idle + [(p, c) for c, (p, _) in running.items()]:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
            channel.close()
