"""Who used the CPUs during a point: every process's CPU time, sampled while the tier runs.

A comparison of two servers' speed on a shared host means little without it: the busy
neighbour, the client, the servers and anything else of the host each take a share of the two
cores, and the kernel splits a core between sessions (scheduler autogroups) before it splits a
session's share between its processes. The report names, per process, its CPU seconds over a
window, the CPU it last ran on and its autogroup, and each CPU's busy share.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
SAMPLE_EVERY_S = 0.5


@dataclass(frozen=True)
class ProcessSample:
    comm: str
    autogroup: str
    cpu_s: float
    last_cpu: int


@dataclass(frozen=True)
class Sample:
    at_unix: float
    processes: dict[int, ProcessSample]
    cpu_busy_s: dict[str, float]  # per CPU ("cpu0"...), from /proc/stat


def _process(pid_dir: Path) -> ProcessSample | None:
    try:
        stat = (pid_dir / "stat").read_text()
        # Kernel threads and init have none: the root group.
        group = ((pid_dir / "autogroup").read_text().split() or ["/"])[0]
    except OSError:
        return None
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat.rsplit(")", 1)[1].split()
    # Fields after the name: state is [0], utime [11], stime [12], processor [36].
    cpu_s = (int(fields[11]) + int(fields[12])) / TICKS_PER_S
    return ProcessSample(comm, group, cpu_s, int(fields[36]))


def _cpu_busy() -> dict[str, float]:
    busy = {}
    for line in Path("/proc/stat").read_text().splitlines():
        words = line.split()
        if words and words[0].startswith("cpu") and words[0] != "cpu":
            ticks = [int(w) for w in words[1:]]
            # user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
            busy[words[0]] = (sum(ticks[:8]) - ticks[3] - ticks[4]) / TICKS_PER_S
    return busy


def sample() -> Sample:
    found = {}
    for pid_dir in Path("/proc").glob("[0-9]*"):
        proc = _process(pid_dir)
        if proc is not None:
            found[int(pid_dir.name)] = proc
    return Sample(time.time(), found, _cpu_busy())


class CpuWatch:
    """Samples every process until stopped; `report(start, end)` over any window inside.

    A sample reads a few hundred files, 2-3 ms of CPU: left to the scheduler, that lands on the
    measuring client's CPU twice a second as event-loop stalls of the same length, which the
    client's self-check counts. The sampling thread runs on `cpu` instead (the server's)."""

    def __init__(self, cpu: int) -> None:
        self.cpu = cpu
        self.samples: list[Sample] = [sample()]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cpu-watch")
        self._thread.start()

    def _run(self) -> None:
        os.sched_setaffinity(0, {self.cpu})  # this thread only (Linux affinity is per thread)
        while not self._stop.wait(SAMPLE_EVERY_S):
            self.samples.append(sample())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def report(self, start_unix: float, end_unix: float, top: int = 6) -> str:
        inside = [s for s in self.samples if start_unix <= s.at_unix <= end_unix]
        if len(inside) < 2:
            return f"cpu watch: {len(inside)} samples in the window"
        first, last = inside[0], inside[-1]
        span = last.at_unix - first.at_unix
        used = []
        for pid, now in last.processes.items():
            before = first.processes.get(pid)
            spent = now.cpu_s - (before.cpu_s if before is not None else 0.0)
            if spent > 0:
                used.append((spent, pid, now))
        used.sort(reverse=True)
        cpus = ", ".join(f"{name} {(last.cpu_busy_s[name] - first.cpu_busy_s[name]) / span:.0%}"
                         for name in sorted(last.cpu_busy_s))
        heavy = "; ".join(f"{proc.comm}[{pid}] {spent / span:.0%} on cpu{proc.last_cpu} "
                          f"{proc.autogroup}" for spent, pid, proc in used[:top])
        return f"over {span:.1f} s: busy {cpus}; top {heavy}"
