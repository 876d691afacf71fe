"""How fast the `sim` backend simulates the MiniMax-M3 MI355X ATOM sweep (72 points).

Loads the shipped recipe and launch specs exactly as a pytest run does, starts one `sim` server
handle per node and times every point's `run_point`. Prints wall seconds per point, per node and
in total (and the CPU seconds, which other load on the machine does not inflate), plus the
predicted key numbers so a regression in speed or physics is visible.

    python benchmarks/bench_sim_speed.py [--filter minimaxm3-fp4] [--pytest]

`--pytest` also times the real `pytest -k "minimaxm3 and mi355x and atom"` run under the
default backend (collection, result files and reporting included).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from pytest_inferbench.backends.base import LoadSettings, StartContext
from pytest_inferbench.backends.sim import SimBackend
from pytest_inferbench.launch import resolve
from pytest_inferbench.metrics import summarize
from pytest_inferbench.schema import load_recipe

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", default="", help="substring of the node name to keep")
    parser.add_argument("--pytest", action="store_true", help="also time the pytest run")
    args = parser.parse_args()
    recipe = load_recipe(HERE / "amd-master.yaml")
    servers = [s for s in recipe.servers if s.model_prefix == "minimaxm3"
               and s.hardware == "MI355X" and s.framework == "atom"
               and args.filter in s.node_name]
    ctx = StartContext(results_dir=Path("/tmp"), run_id="bench", worker_id="master", options=None)
    load = LoadSettings()
    backend = SimBackend()
    total = 0.0
    points = 0
    sim_cpu = 0.0
    print(f"{'point':<62} {'wall s':>7} {'TTFT ms':>9} {'TPOT ms':>8} {'out tok/s':>10} {'AL':>5}")
    for server in servers:
        handle = backend.start(server, resolve(server, HERE / "launch"), ctx)
        node_wall = 0.0
        for point in server.points():
            t0, c0 = time.perf_counter(), time.process_time()
            m = handle.run_point(point, load)
            wall = time.perf_counter() - t0
            sim_cpu += time.process_time() - c0
            node_wall += wall
            points += 1
            s = summarize(m.records, duration_s=m.duration_s, num_prompts=m.num_prompts,
                          max_concurrency=m.max_concurrency, num_gpus=server.tp)
            al = m.server_metrics.get("acceptance_length")
            print(f"{server.node_name + '::' + point.name:<62} {wall:7.3f} "
                  f"{s['mean_ttft_ms']:9.1f} {s['mean_tpot_ms']:8.2f} "
                  f"{s['output_throughput']:10.0f} {al if al is None else round(al, 2)!s:>5}")
        handle.stop()
        total += node_wall
        print(f"  node {server.node_name}: {node_wall:.2f} s")
    print(f"simulated {points} points in {total:.2f} s wall, {sim_cpu:.2f} s CPU "
          "(target: whole pytest run < 15 s; wall > CPU means other load on the machine)")
    if args.pytest:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "-k", "minimaxm3 and mi355x and atom", str(HERE / "amd-master.yaml")],
            cwd=HERE, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        tail = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
        print(f"pytest -k 'minimaxm3 and mi355x and atom': {wall:.2f} s wall, exit "
              f"{proc.returncode}: {tail[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
