"""GPU power samples during a point's measured phase, as InferenceX's `start_gpu_monitor`
takes them: `nvidia-smi` (its query, CSV, one sample a second) or else `amd-smi` (its metric
watch, one a second, the header kept once), whichever is on PATH, running from just before the
measured load to just after it. The samples in the benchmark's window become each GPU's mean
power (`results.power.window_power`, as `aggregate_power.py` takes them); no tool, a tool that
fails, or no sample in the window leaves the power invalid with the reason, never a number.

Only a server whose GPUs are on this host is sampled: the tool sees this host's GPUs, all of
them (InferenceX's query names no GPU, and counts every GPU listed), also those of another
xdist worker's slice or of no server at all.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from typing import IO

from ..results.power import PowerReading, window_power

NVIDIA_QUERY = ("timestamp,index,power.draw,temperature.gpu,clocks.current.sm,"
                "clocks.current.memory,utilization.gpu,utilization.memory")
INTERVAL_S = 1
TOOLS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("nvidia-smi", (f"--query-gpu={NVIDIA_QUERY}", "--format=csv", "-l", str(INTERVAL_S))),
    ("amd-smi", ("metric", "-p", "-c", "-t", "-u", "-w", str(INTERVAL_S), "--csv")),
)
NO_TOOL = "none"
STOP_WAIT_S = 5.0


def amd_rows(text: str) -> str:
    """amd-smi's watch output as InferenceX keeps it: from its first `timestamp,` header on,
    every later header dropped (the tool repeats it each interval, after preamble lines)."""
    kept: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("timestamp,"):
            if not kept:
                kept.append(line)
        elif kept:
            kept.append(line)
    return "".join(kept)


class GpuPowerMonitor:
    """One running sampler; `stop()` ends it and reads the point's power."""

    def __init__(self, tool: str, process: subprocess.Popen[bytes], output: IO[bytes]) -> None:
        self.tool = tool
        self._process = process
        self._output = output

    @classmethod
    def start(cls) -> GpuPowerMonitor | None:
        """The first tool on PATH, started; None when there is none (or it cannot start)."""
        for tool, args in TOOLS:
            program = shutil.which(tool)
            if program is None:
                continue
            output = tempfile.TemporaryFile()  # noqa: SIM115 -- kept open until stop()
            try:
                # In the run's own process group: an interrupt that stops the run stops it too.
                process = subprocess.Popen([program, *args], stdout=output,
                                           stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
            except OSError:
                output.close()
                return None
            return cls(tool, process, output)
        return None

    def stop(self) -> str:
        """End the sampler and return what it wrote (amd-smi's headers deduplicated)."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._output.seek(0)
        text = self._output.read().decode("utf-8", errors="replace")
        self._output.close()
        if not text.endswith("\n"):  # a row cut off by the stop is no sample
            text = text[:text.rfind("\n") + 1]
        return amd_rows(text) if self.tool == "amd-smi" else text

    def reading(self, start_unix: float, end_unix: float) -> PowerReading:
        """Stop, and each GPU's mean power over [start, end] from the samples."""
        samples = self.stop()
        found = window_power(samples, start_unix, end_unix)
        if isinstance(found, str):
            return PowerReading.missing(self.tool, f"{self.tool}: {found}", samples or None)
        watts, gpus = found
        return PowerReading(self.tool, avg_power_w=watts, num_gpus=gpus,
                            samples_csv=samples)


def power_reading(sampler: GpuPowerMonitor | str, start_unix: float, end_unix: float
                  ) -> PowerReading:
    """The point's power from a running sampler (stopped here), or the reason there is none."""
    if isinstance(sampler, GpuPowerMonitor):
        return sampler.reading(start_unix, end_unix)
    return PowerReading.missing(NO_TOOL, sampler)


def discard(sampler: GpuPowerMonitor | str) -> None:
    """Stop a sampler whose point did not finish."""
    if isinstance(sampler, GpuPowerMonitor):
        sampler.stop()


NO_TOOL_REASON = "no nvidia-smi or amd-smi on PATH: GPU power not sampled"
NOT_LOCAL_REASON = "the server's GPUs are not on this host: GPU power not sampled"
