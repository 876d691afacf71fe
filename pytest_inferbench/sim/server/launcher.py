"""Start the simulated HTTP server as a subprocess (tests, benchmarks, other backends).

    with running_sim_server(atom_argv, ["--time-scale", "0"]) as server:
        httpx.get(server.base_url + "/v1/models")

The server binds a free 127.0.0.1 port chosen by the kernel (`--port 0`) and reports it
through `--port-file`, so parallel starts never race for a port. Its output goes to a log
file whose tail is quoted in every error.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

PORT_WAIT_S = 30.0


class SimServerError(RuntimeError):
    """The simulator did not start or become healthy; the message has its log tail."""


@dataclass
class SimServer:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_healthy(self, timeout_s: float = 30.0) -> float:
        """Poll /health until 200; returns the seconds waited."""
        start = time.monotonic()
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise SimServerError(f"simulator exited with status {code} before becoming "
                                         f"healthy; log tail:\n{self.log_tail()}")
                try:
                    if client.get(self.base_url + "/health").status_code == 200:
                        return time.monotonic() - start
                except httpx.TransportError:
                    pass
                if time.monotonic() - start > timeout_s:
                    raise SimServerError(f"simulator not healthy after {timeout_s:.0f} s; "
                                         f"log tail:\n{self.log_tail()}")
                time.sleep(0.05)

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """Terminate (then kill) the process; idempotent. Returns its exit status."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        return self.process.returncode


def sim_command(argv: Sequence[str], extra_options: Sequence[str] = (),
                port_file: Path | None = None, port: int = 0) -> list[str]:
    command = [sys.executable, "-m", "pytest_inferbench.sim", "serve", *extra_options,
               "--port", str(port)]
    if port_file is not None:
        command += ["--port-file", str(port_file)]
    return [*command, "--", *argv]


def launch(argv: Sequence[str], extra_options: Sequence[str] = (), *,
           env: Mapping[str, str] | None = None, log_dir: Path | None = None) -> SimServer:
    """Start the simulator on a free port; returns once the port is known (not yet healthy)."""
    workdir = Path(tempfile.mkdtemp(prefix="inferbench-sim-", dir=log_dir))
    port_file = workdir / "port"
    log_path = workdir / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            sim_command(argv, extra_options, port_file), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=None if env is None else dict(env))
    server = SimServer("", process, log_path)
    deadline = time.monotonic() + PORT_WAIT_S
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise SimServerError(f"simulator did not start (status {process.returncode}); "
                                 f"log tail:\n{server.log_tail()}")
        time.sleep(0.02)
    server.base_url = f"http://127.0.0.1:{int(port_file.read_text())}"
    return server


def start_sim_server(argv: Sequence[str], extra_options: Sequence[str] = ()
                     ) -> tuple[str, subprocess.Popen[bytes]]:
    """Start the simulator for a server argv; (base URL, process). The caller stops it."""
    server = launch(argv, extra_options)
    return server.base_url, server.process


@contextlib.contextmanager
def running_sim_server(argv: Sequence[str], extra_options: Sequence[str] = (), *,
                       wait_healthy: bool = True, timeout_s: float = 30.0,
                       env: Mapping[str, str] | None = None) -> Iterator[SimServer]:
    """A started (and, by default, healthy) simulator, killed on exit."""
    server = launch(argv, extra_options, env=env)
    try:
        if wait_healthy:
            server.wait_healthy(timeout_s)
        yield server
    finally:
        server.stop()
