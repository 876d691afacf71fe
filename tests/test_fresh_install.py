"""The README as a new user meets it: a clean clone, a fresh virtual environment, the README's
two commands, then the flows it documents.

A plain `python -m venv` (no system site packages): `pip install -e .` must bring everything the
documented flows import. Flows that need infrastructure (a Docker Engine, Slurm, an InferenceX
checkout, a GPU server) have their own tests and are not repeated here. The second README
command's suite (`pytest tests`, minutes long) is not run whole: the fresh environment
collects it with bare `pytest` and runs the test that bare `pytest` once broke (assertion
rewriting of the editable install). Runs from the committed HEAD (what a clone gives).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
SMALL_POINT = "minimaxm3 and fp4 and mi355x and atom and mtp and isl1024 and conc4"
ATOM_ARGV = ["python3", "-m", "atom.entrypoints.openai_server", "--model",
             "amd/MiniMax-M3-MXFP4", "-tp", "4", "--method", "eagle3", "--draft-model",
             "Inferact/MiniMax-M3-EAGLE3", "--num-speculative-tokens", "3"]


class Venv:
    def __init__(self, root: Path, clone: Path) -> None:
        self.bin = root / "bin"
        self.clone = clone
        # This suite's own PYTHONPATH (a worktree run) must not reach into the fresh one, nor
        # its bytecode cache (tests/conftest.py): the fresh environment reads the bytecode pip
        # compiled into it, as a new user's does.
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER",
                                 "PYTEST_CURRENT_TEST", "PYTHONPYCACHEPREFIX")}
        self.env.update(PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
                        VIRTUAL_ENV=str(root), PIP_DISABLE_PIP_VERSION_CHECK="1")

    def run(self, *argv: str, timeout: float = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(argv), cwd=self.clone, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout, check=False)
        return done

    def ok(self, *argv: str, timeout: float = 600,
           env: dict[str, str] | None = None) -> str:
        done = self.run(*argv, timeout=timeout, env=env)
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{' '.join(argv)} -> {done.returncode}\n{output[-4000:]}"
        return output


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    base = tmp_path_factory.mktemp("fresh")
    clone = base / "pytest-inferbench"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True, timeout=120)
    env = Venv(base / "venv", clone)
    env.ok("pip", "install", "-q", "-e", ".")  # the README's first command, its install
    return env


@pytest.mark.slow
def test_first_command_runs_the_matrix_with_the_base_install(venv: Venv) -> None:
    where = venv.ok("python", "-c", "import pytest_inferbench; print(pytest_inferbench.__file__)")
    assert where.strip() == str(venv.clone / "pytest_inferbench" / "__init__.py")
    output = venv.ok("pytest", "-k", "minimaxm3")
    # pytest's closing line: passes only (a table's "error unknown" is not an error).
    outcome = [line for line in output.splitlines() if line.startswith("=") and " in " in line][-1]
    assert " passed" in outcome and "failed" not in outcome and "error" not in outcome, output
    summary = json.loads((venv.clone / "inferbench-results" / "summary.json").read_text())
    assert summary["points"] and all(p["simulated"] for p in summary["points"])


@pytest.mark.slow
def test_documented_flows_work_with_the_base_install(venv: Venv, tmp_path: Path) -> None:
    # The simulator as a server, started first: it loads while the listings below run (they
    # only read the clone); then usage, serving until healthy, and a run against it as an
    # external server.
    port = free_port()
    server_log = tmp_path / "server.log"  # a file: a pipe nobody reads meanwhile could fill
    with server_log.open("wb") as log:
        server = subprocess.Popen(
            ["python", "-m", "pytest_inferbench.sim", "serve", "--hardware", "MI355X",
             "--time-scale", "0", "--", *ATOM_ARGV, "--server-port", str(port)],
            cwd=venv.clone, env=venv.env, stdout=subprocess.DEVNULL, stderr=log)
    no_gates = tmp_path / "no-gates.yaml"
    no_gates.write_text("slo: []\n")  # time scale 0 is for functional checks: no SLO applies
    small = ("-k", SMALL_POINT, "-m", "not eval", "--inferbench-prompts-per-conc=1",
             f"--inferbench-gates={no_gates}", "--inferbench-no-plots")
    try:
        # Selecting points.
        listed = venv.ok("pytest", "--collect-only", "-q", "-k", "minimaxm3 and mi355x and atom")
        points = [line for line in listed.splitlines() if "-conc" in line and "::" in line]
        assert len(points) == 72  # as the README says
        listed = venv.ok("pytest", "--collect-only", "-q", "-m", "inferbench(conc=64, tp=4)")
        points = [line for line in listed.splitlines() if "::" in line]
        assert points and all(line.endswith("-conc64") and "-tp4" in line for line in points)
        assert "serve" in venv.ok("python", "-m", "pytest_inferbench.sim", "--help")
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server_log.read_text(errors="replace")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the simulated server never became healthy"
            time.sleep(0.5)
        out = venv.ok("pytest", *small, "--inferbench-backend", "external",
                      f"--inferbench-base-url=http://127.0.0.1:{port}")
        assert "1 passed" in out
    finally:
        server.terminate()
        server.wait(timeout=30)
    # The sim-server backend (the same simulator, started per node).
    out = venv.ok("pytest", *small, "--inferbench-backend", "sim-server",
                  "--inferbench-time-scale", "0")
    assert "1 passed" in out and "TIMINGS NOT MEANINGFUL" in out
    # Evals on the simulated backends (an oracle server answers; accuracy fixed for the test).
    data = tmp_path / "gsm8k" / "test.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({
        "question": f"A box holds {i} pens and {i + 7} pencils. How many in all?",
        "answer": f"{i} + {i + 7} = {2 * i + 7}\n#### {2 * i + 7}"}) + "\n" for i in range(20)))
    out = venv.ok("pytest", "-m", "eval", "-k", "minimaxm3 and mi355x and atom and mtp",
                  f"--inferbench-eval-data={data}", "--inferbench-eval-limit=10",
                  env={"INFERBENCH_SIM_EVAL_ACCURACY": "1.0"})
    assert "passed" in out and "eval gsm8k: strict-match 1.0000" in out


@pytest.mark.slow
def test_second_command_installs_the_test_extra_and_bare_pytest_works(venv: Venv) -> None:
    venv.ok("pip", "install", "-q", "-e", ".[test]")
    # The collection and the test run side by side: both only read the clone.
    with ThreadPoolExecutor(2) as pool:
        listing = pool.submit(venv.ok, "pytest", "tests", "--collect-only", "-q", "-p",
                              "no:cacheprovider")
        run = pool.submit(venv.ok, "pytest", "tests/report/test_report.py", "-k", "xdist", "-p",
                          "no:cacheprovider")
        listed, out = listing.result(), run.result()
    assert "tests collected" in listed and "error" not in listed.splitlines()[-1]
    assert "1 passed" in out
