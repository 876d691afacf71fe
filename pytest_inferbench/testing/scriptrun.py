"""Run an InferenceX server script with stub programs that record what they were given.

InferenceX's `benchmarks/single_node/*/*.sh` scripts start a server (`python3 -m sglang...`,
`vllm serve`, `trtllm-serve` under `mpirun`), wait for `/health` and run the benchmark client.
With the stubs first on PATH nothing real runs: every stubbed program appends its argv, the
environment it saw and (for `trtllm-serve`) the extra-options YAML it was pointed at to a JSON
lines log, and exits 0. `curl` succeeds at once, so the script goes straight to its client.

The scripts write their server log to `/workspace/server.log` (the serving container's work
directory), so `/workspace` must exist and be writable; `workspace_available()` says whether it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..frameworks import registry

WORKSPACE = Path("/workspace")
# Python (modules such as `sglang.launch_server`) and every framework's own executables.
SERVER_PROGRAMS = ("python3", "python",
                   *(p for framework in registry.frameworks() for p in framework.programs))
SILENT_PROGRAMS = ("mpirun", "hf", "huggingface-cli", "nvidia-smi", "amd-smi", "rocm-smi",
                   "curl", "pip", "pip3", "sleep")

_STUB = '''#!{python}
import json, os, sys
argv = [os.path.basename(sys.argv[0]), *sys.argv[1:]]
name = argv[0]
if name == "mpirun":
    # mpirun's own options come first; the program it launches is the first known server word.
    rest = argv[1:]
    for i, word in enumerate(rest):
        if os.path.basename(word) in {servers!r}:
            argv = rest[i:]
            break
    else:
        sys.exit(0)
    name = os.path.basename(argv[0])
if name.startswith("python") and (len(argv) == 1 or argv[1] in ("-", "-c")):
    if len(argv) <= 2 and not sys.stdin.isatty():
        sys.stdin.read()
    sys.exit(0)  # inline patch snippets and import probes: not a server
files = {{}}
for i, word in enumerate(argv):
    for flag in ("--extra_llm_api_options", "--extra-llm-api-options", "--config"):
        path = None
        if word == flag and i + 1 < len(argv):
            path = argv[i + 1]
        elif word.startswith(flag + "="):
            path = word.split("=", 1)[1]
        if path and os.path.isfile(path):
            files[path] = open(path, encoding="utf-8").read()
with open(os.environ["INFERBENCH_STUB_LOG"], "a", encoding="utf-8") as log:
    log.write(json.dumps({{"argv": argv, "env": dict(os.environ), "files": files}}) + "\\n")
'''


@dataclass(frozen=True)
class Invocation:
    argv: tuple[str, ...]
    env: dict[str, str]  # only the variables the script added or changed
    files: dict[str, str]  # config files the program was pointed at, by path


@dataclass(frozen=True)
class ScriptRun:
    server: Invocation
    client: Invocation | None  # None when the script stopped before its benchmark client
    returncode: int
    output: str


def workspace_available() -> bool:
    if WORKSPACE.is_dir():
        return os.access(WORKSPACE, os.W_OK)
    try:
        WORKSPACE.mkdir()
    except OSError:
        return False
    return True


def make_stub_bin(folder: Path) -> Path:
    """Write the stub programs into `folder` and return it (put it first on PATH)."""
    text = _STUB.format(python=sys.executable, servers=SERVER_PROGRAMS)
    for name in (*SERVER_PROGRAMS, *SILENT_PROGRAMS):
        stub = folder / name
        # Programs that only have to succeed are plain shell (no interpreter start-up).
        stub.write_text("#!/bin/sh\nexit 0\n" if name in SILENT_PROGRAMS and name != "mpirun"
                        else text, encoding="utf-8")
        stub.chmod(0o755)
    return folder


def run_script(script: Path, env: dict[str, str], *, timeout_s: float = 60.0) -> ScriptRun:
    """Run one server script with `env` (MODEL, TP, CONC, ...) on stubbed programs."""
    with tempfile.TemporaryDirectory(prefix="inferbench-stubs-") as tmp:
        work = Path(tmp)
        (work / "bin").mkdir()
        stub_bin = make_stub_bin(work / "bin")
        log = work / "calls.jsonl"
        base = {"PATH": f"{stub_bin}:/usr/bin:/bin", "HOME": str(work),
                "INFERBENCH_STUB_LOG": str(log), "PORT": "8888", **env}
        # Output to a file, not a pipe: a background child that keeps the pipe open (the
        # script's GPU monitor) must not make us wait for it.
        out_path = work / "output.txt"
        with out_path.open("w", encoding="utf-8") as out:
            proc = subprocess.run(["bash", str(script.resolve())], cwd=work, env=base,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  check=False)
        output = out_path.read_text(encoding="utf-8", errors="replace")
        # The server was started in the background: give its stub time to write its line.
        deadline = time.monotonic() + 5.0
        calls: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
            calls = [json.loads(line) for line in lines if line.endswith("}")]
            if len(calls) >= 2 or proc.returncode != 0:
                break
            time.sleep(0.02)
    if not calls:
        raise RuntimeError(f"{script.name}: started no server; output tail:\n"
                           f"{output[-2000:]}")
    shell_vars = {"PWD", "SHLVL", "_", "OLDPWD", "LC_CTYPE"}
    invocations = [
        Invocation(argv=tuple(c["argv"]),
                   env={k: v for k, v in c["env"].items()
                        if k not in shell_vars and base.get(k) != v},
                   files=c["files"])
        for c in calls]
    client = next((i for i in invocations if any("benchmark_serving" in w for w in i.argv)),
                  None)
    server = next((i for i in invocations if i is not client), None)
    if server is None:
        raise RuntimeError(f"{script.name}: started no server; output tail:\n"
                           f"{output[-2000:]}")
    return ScriptRun(server=server, client=client, returncode=proc.returncode, output=output)
