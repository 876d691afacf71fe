"""How fast the `sim` backend simulates the MiniMax-M3 MI355X ATOM sweep (72 points).

Loads the shipped recipe and launch specs exactly as a pytest run does, starts one `sim` server
handle per node and times every point's `run_point`. Prints wall seconds per point, per node and
in total (and the CPU seconds, which other load on the machine does not inflate), plus the
predicted key numbers so a regression in speed or physics is visible.

    python benchmarks/bench_sim_speed.py [--filter minimaxm3-fp4] [--pytest]

`--pytest` also times the real `pytest -k "minimaxm3 and mi355x and atom"` run under the
default backend (collection, result files and reporting included).

`--multinode DIR` does the same for every multinode fixed-seq-len point (disaggregated and
aggregated deployments, 1354 points) and prints their count, wall and CPU time:

    python benchmarks/bench_sim_speed.py --multinode ../shared/inferencex --jobs 2

The multinode run takes hours; `--nodes A:B` runs a slice of the nodes in that order (largest
total concurrency first, ties by name), so the run can be done in parts that add up to all of it.

`--matrix DIR` instead runs every single-node fixed-seq-len point of an InferenceX checkout's
master files (`DIR/.github/configs/{amd,nvidia}-master.yaml`, 2973 points) with the packaged
launch specs, over `--jobs` processes, and prints the whole-matrix wall time and every failure
by cause:

    python benchmarks/bench_sim_speed.py --matrix ../shared/inferencex --jobs 2 [--pytest]

With `--pytest` it also times the real `pytest .github/configs -m "not eval"` over the same
2973 single-node points (`-k` leaves out the multinode disaggregated and the agentic nodes) in
a temporary copy of the checkout (`-n JOBS` when JOBS > 1): wall and CPU seconds (pytest and
its workers), and pytest's own summary line.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from node_pool import run_each

from pytest_inferbench.backends.base import LoadSettings, StartContext
from pytest_inferbench.backends.sim import SimBackend
from pytest_inferbench.recipe.launch import resolve
from pytest_inferbench.recipe.schema import load_recipe
from pytest_inferbench.results.metrics import summarize

HERE = Path(__file__).resolve().parent
# The single-node fixed-seq-len nodes of InferenceX's master files, by name.
SINGLE_NODE = "not disagg and not dynamo and not agentic"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", default="", help="substring of the node name to keep")
    parser.add_argument("--pytest", action="store_true", help="also time the pytest run")
    parser.add_argument("--matrix", type=Path, default=None, metavar="DIR",
                        help="run the whole single-node matrix of an InferenceX checkout")
    parser.add_argument("--multinode", type=Path, default=None, metavar="DIR",
                        help="run every multinode point of an InferenceX checkout")
    parser.add_argument("--jobs", type=int, default=2,
                        help="processes for --matrix / --multinode")
    parser.add_argument("--nodes", default=":", metavar="A:B",
                        help="only nodes A to B-1 of the run's order (largest first)")
    args = parser.parse_args()
    if args.matrix is not None:
        status = run_matrix(args.matrix, args.jobs, args.filter, nodes=args.nodes)
        if args.pytest:
            status = time_matrix_pytest(args.matrix, args.jobs) or status
        return status
    if args.multinode is not None:
        return run_matrix(args.multinode, args.jobs, args.filter, multinode=True,
                          nodes=args.nodes)
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
                          max_concurrency=m.max_concurrency, num_gpus=server.parallel.tp)
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


def _run_node(server: object) -> tuple[str, int, float, list[str]]:
    """All points of one node: (node, points run, CPU seconds, failures)."""
    from pytest_inferbench.backends.base import ServerStartError
    from pytest_inferbench.recipe.model import ServerConfig

    assert isinstance(server, ServerConfig)
    ctx = StartContext(results_dir=Path("/tmp"), run_id="bench", worker_id="master",
                       options=None)
    c0 = time.process_time()
    failures: list[str] = []
    done = 0
    try:
        handle = SimBackend().start(server, resolve(server, Path(server.source).parent / "launch"),
                                    ctx)
    except ServerStartError as exc:
        return server.node_name, 0, time.process_time() - c0, [f"start: {exc}"]
    for point in server.points():
        try:
            m = handle.run_point(point, LoadSettings())
            summarize(m.records, duration_s=m.duration_s, num_prompts=m.num_prompts,
                      max_concurrency=m.max_concurrency, num_gpus=server.gpus)
            done += 1
        except Exception as exc:  # every failure is reported by cause below
            failures.append(f"{point.name}: {type(exc).__name__}: {exc}")
    return server.node_name, done, time.process_time() - c0, failures


def run_matrix(checkout: Path, jobs: int, name_filter: str, multinode: bool = False,
               nodes: str = ":") -> int:
    from pytest_inferbench.testing.inferencex import multinode_servers, single_node_servers

    select = multinode_servers if multinode else single_node_servers
    servers = [s for f in ("amd-master.yaml", "nvidia-master.yaml")
               for s in select(checkout / ".github" / "configs" / f)
               if name_filter in s.node_name]
    # Longest nodes first, so the last process to finish is not left with a big one.
    servers.sort(key=lambda s: (-sum(p.conc for p in s.points()), s.node_name))
    first, _, last = nodes.partition(":")
    servers = servers[int(first) if first else None:int(last) if last else None]
    total = sum(len(s.points()) for s in servers)
    t0 = time.perf_counter()
    results: list[tuple[str, int, float, list[str]]] = []
    # A line per node as it ends: a long run shows how far it got if it is stopped.
    for ended, outcome in enumerate(run_each(_run_node, servers, jobs), start=1):
        # A node whose process died: each of its points failed, with the cause.
        result = outcome.result or (outcome.item.node_name, 0, 0.0, [
            f"{point.name}: died: {outcome.death}" for point in outcome.item.points()])
        results.append(result)
        print(f"  [{ended}/{len(servers)} nodes, {time.perf_counter() - t0:.0f} s] "
              f"{result[0]}: {result[1]} points, {result[2]:.2f} s CPU, "
              f"{len(result[3])} failed", flush=True)
    wall = time.perf_counter() - t0
    done = sum(r[1] for r in results)
    cpu = sum(r[2] for r in results)
    causes: collections.Counter[str] = collections.Counter()
    for node, _, _, failures in results:
        for failure in failures:
            print(f"FAILED {node}::{failure}")
            causes[failure.split(":")[1].strip() if failure.startswith("start") else
                   failure.split(": ")[1]] += 1
    for node, _, node_cpu, _ in sorted(results, key=lambda r: -r[2])[:5]:
        print(f"slowest node {node}: {node_cpu:.2f} s CPU")
    kind = "multinode" if multinode else "whole"
    if nodes != ":":
        kind += f" (nodes {nodes} of the run's order)"
    target_s = 120 if multinode else 60  # the multinode matrix's own target is 120 s
    print(f"{kind} matrix: {done} of {total} points in {wall:.1f} s wall, {cpu:.1f} s CPU "
          f"over {jobs} processes, {len(servers)} server nodes (target: <= {target_s} s wall)")
    # Other jobs on the machine stretch the wall time, not the CPU time: say how busy it was.
    print(f"load average at the end (1/5/15 min): "
          f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for cause, n in causes.most_common():
        print(f"  {n} failures: {cause}")
    return 0 if done == total else 1


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_matrix_pytest(checkout: Path, jobs: int) -> int:
    """The real run a user types in an InferenceX checkout, in a throwaway copy of it."""
    with tempfile.TemporaryDirectory(prefix="inferbench-matrix-") as tmp:
        copy = Path(tmp) / "inferencex"
        shutil.copytree(checkout, copy, ignore=shutil.ignore_patterns(".git"))
        argv = [sys.executable, "-m", "pytest", ".github/configs", "-m", "not eval", "-q",
                "-p", "no:cacheprovider", "-k", SINGLE_NODE]
        if jobs > 1:
            argv += ["-n", str(jobs), "--dist", "loadgroup"]
        c0, t0 = _children_cpu(), time.perf_counter()
        proc = subprocess.run(argv, cwd=copy, capture_output=True, text=True, check=False)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    lines = [line for line in proc.stdout.splitlines() if " in " in line and "passed" in line]
    tail = (lines or proc.stdout.strip().splitlines()[-1:] or ["(no output)"])[-1]
    print(f"pytest .github/configs -m 'not eval' -k '{SINGLE_NODE}'"
          f"{f' -n {jobs}' if jobs > 1 else ''}: "
          f"{wall:.1f} s wall, {cpu:.1f} s CPU (target: <= 60 s wall), exit "
          f"{proc.returncode}: {tail.strip('= ')}")
    if proc.returncode not in (0, 1):
        print(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
