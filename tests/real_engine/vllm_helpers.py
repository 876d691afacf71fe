"""Helpers and fixtures of the real-engine tier (`conftest.py` hands the fixtures to pytest).

The venv and the model are made once by `benchmarks/real_engine/cpu_project.py` (in
`~/.cache/pytest-inferbench/`, reused by later runs; `$INFERBENCH_VLLM_CACHE` moves it). A failed
install fails every test of the tier with its reason: these tests never skip.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = REPO / "benchmarks" / "real_engine" / "cpu_project.py"


def _setup_module() -> ModuleType:
    """cpu_project.py, the script (not a package module): its facts, e.g. the server's CPU."""
    sys.path.insert(0, str(SETUP_SCRIPT.parent))
    try:
        return importlib.import_module(SETUP_SCRIPT.stem)
    finally:
        sys.path.remove(str(SETUP_SCRIPT.parent))


SERVER_CPU: int = _setup_module().SERVER_CPU
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
STARTUP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class CpuProject:
    """What cpu_project.py wrote: the recipe directory, the venv's python, the model."""

    path: Path
    python: Path
    model: Path
    served_model: str

    def launch_spec(self) -> Path:
        return next((self.path / "launch").glob("*.yaml"))


@pytest.fixture(scope="session")
def cpu_project(tmp_path_factory: pytest.TempPathFactory) -> CpuProject:
    out = tmp_path_factory.mktemp("cpu-project")
    done = subprocess.run([sys.executable, str(SETUP_SCRIPT), str(out)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"vLLM CPU setup failed ({SETUP_SCRIPT.name} exited {done.returncode}):\n"
                    f"{done.stderr[-3000:]}{done.stdout[-2000:]}", pytrace=False)
    paths = json.loads(done.stdout.strip().splitlines()[-1])
    write_eval_files(out)
    return CpuProject(out, Path(paths["python"]), Path(paths["model"]), paths["served_model"])


def write_eval_files(project: Path) -> None:
    """GSM8K-format questions made up here (question, worked answer ending '#### N'), and
    InferenceX's default GSM8K threshold."""
    rng = random.Random(7)
    for name, count in (("test.jsonl", 8), ("train.jsonl", 5)):
        lines = []
        for i in range(count):
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            lines.append(json.dumps({
                "question": f"Ana has {a} shells and finds {b} more on beach {i}. "
                            "How many shells does she have?",
                "answer": f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b} shells.\n#### {a + b}"}))
        (project / "data").mkdir(exist_ok=True)
        (project / "data" / name).write_text("\n".join(lines) + "\n")
    (project / "evals").mkdir(exist_ok=True)
    (project / "evals" / "thresholds.json").write_text(json.dumps({"default": {"gsm8k": 0.9}}))


@dataclass
class PluginRun:
    returncode: int
    output: str
    results: Path
    elapsed_s: float

    def points(self) -> dict[str, dict[str, object]]:
        """The recipe's raw point files by node and concurrency: `conc8`, `mtp-conc8`."""
        found: dict[str, dict[str, object]] = {}
        for path in sorted((self.results / "points").glob("tinyllama_*.json")):
            if "_test-" in path.name:  # a Python benchmark's point (its test's name ends it)
                continue
            raw = json.loads(path.read_text())
            info = raw["inferbench"]
            spec = "mtp-" if info["spec_decoding"] != "none" else ""
            found[f"{spec}conc{info['conc']}"] = raw
        return found


    def test_points(self, test: str) -> list[dict[str, Any]]:
        """A Python benchmark's raw points in call order: its file names end with the test's
        name, a digest of its node id and, from the second call on, the call's number."""
        tag = re.sub(r"[^A-Za-z0-9.-]+", "-", test)  # as the file names write it
        numbered = []
        for path in (self.results / "points").glob(f"tinyllama_*_{tag}-*.json"):
            call = re.fullmatch(rf".*_{tag}-[0-9a-f]+(?:-(\d+))?", path.stem)
            assert call is not None, path.name
            numbered.append((int(call.group(1) or 1), json.loads(path.read_text())))
        return [raw for _, raw in sorted(numbered, key=lambda pair: pair[0])]


def plugin_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_plugin(project: CpuProject, results: Path, *args: str,
               during: object = None, env: dict[str, str] | None = None) -> PluginRun:
    """A real pytest run of the project's recipe (a process of its own, as a user runs it)."""
    argv = [sys.executable, "-m", "pytest", str(project.path), "-p", "no:cacheprovider",
            "-p", "no:randomly", f"--inferbench-results={results}", "-rA", *args]
    start = time.monotonic()
    results.mkdir(parents=True, exist_ok=True)
    out_path = results.parent / f"{results.name}-output.txt"
    with out_path.open("w") as out:
        proc = subprocess.Popen(argv, cwd=project.path, env={**plugin_env(), **(env or {})},
                                stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        if callable(during):
            during(proc.pid, out_path)
        proc.wait(timeout=1500)
    return PluginRun(proc.returncode, out_path.read_text(), results, time.monotonic() - start)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def vllm_port(pid: int) -> int | None:
    """The port of process `pid` when it is a vLLM API server, else None."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return None
    if SERVER_MODULE in words and "--port" in words:
        return int(words[words.index("--port") + 1])
    return None


def vllm_server_under(pid: int) -> tuple[int, int] | None:
    """The vLLM API server started below process `pid`, and its port."""
    for child in descendants(pid):
        port = vllm_port(child)
        if port is not None:
            return child, port
    return None


def vllm_servers_on(port: int) -> list[int]:
    """Every vLLM API server of this host serving `port`, whoever started it."""
    return [int(p.name) for p in Path("/proc").glob("[0-9]*") if vllm_port(int(p.name)) == port]


def scrape(base_url: str) -> dict[str, float]:
    """vLLM's /metrics, the samples summed over their labels."""
    text = httpx.get(f"{base_url}/metrics", timeout=10.0, trust_env=False).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if match:
            name = match.group(1)
            values[name] = values.get(name, 0.0) + float(match.group(3))
    return values


def histogram_buckets(base_url: str, name: str) -> dict[float, float]:
    """A vLLM histogram's cumulative bucket counts by upper bound (summed over engines)."""
    text = httpx.get(f"{base_url}/metrics", timeout=10.0, trust_env=False).text
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        match = re.match(rf'^{re.escape(name)}_bucket\{{.*le="([^"]+)".*\}}\s+(\S+)$', line)
        if match:
            bound = float(match.group(1))
            buckets[bound] = buckets.get(bound, 0.0) + float(match.group(2))
    return buckets


def wait_healthy(base_url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vLLM exited {proc.returncode} at startup:\n{log.read_text()[-3000:]}",
                        pytrace=False)
        try:
            if httpx.get(f"{base_url}/health", timeout=2.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    pytest.fail(f"vLLM not healthy after {STARTUP_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}",
                pytrace=False)


@dataclass(frozen=True)
class ExternalServer:
    base_url: str
    pid: int


def start_vllm(project: CpuProject, log: Path, extra: tuple[str, ...] = ()
               ) -> tuple[subprocess.Popen[bytes], ExternalServer]:
    """vLLM as a user starts it from the shell pytest runs in: its own process group (for the
    teardown's kill), this session (not a scheduler group of its own)."""
    import yaml

    spec = yaml.safe_load(project.launch_spec().read_text())
    port = free_port()
    words = [w.replace("{model}", str(project.model)).replace("{port}", str(port))
             for w in [*spec["command"], *spec["args"], *extra]]
    env = {**os.environ, **spec.get("env", {})}
    with log.open("wb") as out:
        proc = subprocess.Popen(words, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=os.setpgrp)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base_url, proc, log)
    except BaseException:
        stop_group(proc)
        raise
    return proc, ExternalServer(base_url, proc.pid)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def busy_neighbour() -> Iterator[int]:
    """One CPU-busy process in another session (as a second user's job would be), on the
    server's CPU: it takes a share of the server's core, not of the measuring client's."""
    # It ends itself after an hour should this run be killed before its teardown.
    spin = "import time\nend = time.time() + 3600\nwhile time.time() < end: pass"
    proc = subprocess.Popen(["taskset", "--cpu-list", str(SERVER_CPU), sys.executable, "-c",
                             spin], start_new_session=True)
    yield proc.pid
    proc.kill()
    proc.wait(timeout=30)
