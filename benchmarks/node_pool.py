"""One function per item in forked processes, a few at a time, each result yielded as it ends.

A benchmark's node whose process dies (the kernel kills it for memory) ends as a line that says
so, and the run goes on: `multiprocessing.Pool` waits forever for a task whose worker was
killed, as a whole agentic-matrix run once did for 40 minutes with both cores idle.
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


def _child(func: Callable[[Item], Result], item: Item, sender: Connection) -> None:
    sender.send(func(item))
    sender.close()


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        hint = " (the kernel's out-of-memory killer sends it)" if name == "SIGKILL" else ""
        return f"its process ended by {name}{hint}"
    return f"its process exited with code {exitcode} without a result"


def run_each(func: Callable[[Item], Result], items: Sequence[Item], jobs: int
             ) -> Iterator[Outcome[Item, Result]]:
    """`func(item)` for each item, at most `jobs` at once, in forked processes (the parent's
    imports and data shared); outcomes in the order they end."""
    context = multiprocessing.get_context("fork")
    waiting = list(reversed(items))
    running: dict[Connection, tuple[BaseProcess, Item]] = {}
    while waiting or running:
        while waiting and len(running) < max(jobs, 1):
            item = waiting.pop()
            receiver, sender = context.Pipe(duplex=False)
            process: BaseProcess = context.Process(target=_child, args=(func, item, sender),
                                                   daemon=True)
            process.start()
            sender.close()  # the child's end: EOF here once the child is gone
            running[receiver] = (process, item)
        for ready in wait(list(running)):
            assert isinstance(ready, Connection)
            process, item = running.pop(ready)
            try:
                outcome: Outcome[Item, Result] = Outcome(item, ready.recv())
            except EOFError:
                process.join()
                outcome = Outcome(item, None, _death(process.exitcode))
            ready.close()
            process.join()
            yield outcome
