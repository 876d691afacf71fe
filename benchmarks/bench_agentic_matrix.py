"""How fast the `sim` backend replays every agentic-coding point of a recipe tree in process.

Reads every `*-master.yaml` of the tree (default: the InferenceX copy's `configs/` in
../shared/inferencex-0801 beside the checkout; a checkout's root, its `configs/` or
`.github/configs/` also do) as a pytest run does, keeps the agentic-coding server nodes, starts
one `sim` handle per node and runs each point's `run_point` with the default load (the synthetic
traces, the default 3600 s replay), each node in a process of its own, `--jobs` at once. A point
the `sim` backend skips is counted as skipped, with its reason; a node whose process dies
(killed for memory) fails its points, and the run goes on. Prints a line per node as it ends,
then wall and CPU seconds in all, the points run, skipped and failed, the requests simulated
(and CPU per request) and the slowest nodes; `--profile N` instead profiles the first N points
in this process and prints where the time goes; `--sample K` runs every K-th node only (largest
first), an estimate of the whole on a busy machine.

    python benchmarks/bench_agentic_matrix.py [TREE] [--jobs 2] [--duration 3600] [--sample K]
    python benchmarks/bench_agentic_matrix.py --profile 20
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import time
from dataclasses import replace
from pathlib import Path

from node_pool import run_each

from pytest_inferbench.backends.base import LoadSettings, StartContext
from pytest_inferbench.backends.sim import SimBackend
from pytest_inferbench.options.backend_registry import unsupported_reason
from pytest_inferbench.recipe.agentic import SCENARIO
from pytest_inferbench.recipe.launch import packaged_launch_dir, resolve
from pytest_inferbench.recipe.model import ServerConfig
from pytest_inferbench.recipe.schema import load_recipe
from pytest_inferbench.results.metrics import summarize

DEFAULT_TREE = Path(__file__).resolve().parents[1].parent / "shared" / "inferencex-0801" / "configs"


def master_files(tree: Path) -> list[Path]:
    for directory in (tree, tree / "configs", tree / ".github" / "configs"):
        found = sorted(directory.glob("*-master.yaml"))
        if found:
            return found
    raise SystemExit(f"{tree}: no *-master.yaml here, nor under configs/ or .github/configs/")


def agentic_servers(tree: Path) -> list[ServerConfig]:
    return [s for f in master_files(tree) for s in load_recipe(f, strict=False).servers
            if s.scenario == SCENARIO]


NodeResult = tuple[str, int, list[str], float, list[str], int]


def _run_node(job: tuple[ServerConfig, float]) -> NodeResult:
    """All points of one node: (node, points run, skip reasons, CPU seconds, failures,
    requests simulated)."""
    from pytest_inferbench.backends.base import ServerStartError
    from pytest_inferbench.recipe.launch import LaunchSpecError

    server, duration = job
    load = replace(LoadSettings(), replay_duration_s=duration)
    c0 = time.process_time()
    skipped: list[str] = []
    runnable = []
    for point in server.points():
        reason = unsupported_reason("sim", multinode=server.multinode, agentic=True,
                                    offloading=server.offloading)
        if reason:
            skipped.append(reason)
        else:
            runnable.append(point)
    if not runnable:
        return server.node_name, 0, skipped, time.process_time() - c0, [], 0
    ctx = StartContext(results_dir=Path("/tmp"), run_id="bench", worker_id="master",
                       options=None)
    local = Path(server.source).parent / "launch"
    try:
        handle = SimBackend().start(
            server, resolve(server, local if local.is_dir() else packaged_launch_dir()), ctx)
    except (LaunchSpecError, ServerStartError) as exc:  # as the node's setup error in pytest
        return server.node_name, 0, skipped, time.process_time() - c0, [f"start: {exc}"], 0
    failures: list[str] = []
    done = requests = 0
    for point in runnable:
        try:
            m = handle.run_point(point, load)
            summarize(m.records, duration_s=m.duration_s, num_prompts=m.num_prompts,
                      max_concurrency=m.max_concurrency, num_gpus=server.gpus)
            done += 1
            requests += len(m.records)
        except Exception as exc:  # every failure is reported below
            failures.append(f"{point.name}: {type(exc).__name__}: {exc}")
    return server.node_name, done, skipped, time.process_time() - c0, failures, requests


def run(tree: Path, jobs: int, duration: float, sample: int = 1) -> int:
    servers = agentic_servers(tree)
    # Largest total concurrency first, so the last process is not left with a big node.
    servers.sort(key=lambda s: (-sum(p.conc for p in s.points()), s.node_name))
    every = len(servers)
    servers = servers[::sample]  # every K-th node of that order: an even spread of sizes
    total = sum(len(s.points()) for s in servers)
    print(f"{tree}: {len(servers)} of {every} agentic-coding server nodes, {total} points, "
          f"{duration:g} s replays, {jobs} processes", flush=True)
    t0 = time.perf_counter()
    results: list[NodeResult] = []
    # A line per node as it ends: a run stopped early still says how far it got.
    for ended, outcome in enumerate(run_each(_run_node, [(s, duration) for s in servers], jobs),
                                    start=1):
        server = outcome.item[0]
        # A node whose process died: each of its points failed, with the cause.
        result = outcome.result or (server.node_name, 0, [], 0.0, [
            f"{point.name}: died: {outcome.death}" for point in server.points()], 0)
        results.append(result)
        print(f"  [{ended}/{len(servers)} nodes, {time.perf_counter() - t0:.0f} s] "
              f"{result[0]}: {result[1]} run, {len(result[2])} skipped, "
              f"{len(result[4])} failed, {result[5]} requests, {result[3]:.2f} s CPU",
              flush=True)
    wall = time.perf_counter() - t0
    done = sum(r[1] for r in results)
    reasons = collections.Counter(reason for r in results for reason in r[2])
    cpu = sum(r[3] for r in results)
    failures = [f"{r[0]}::{f}" for r in results for f in r[4]]
    for failure in failures:
        print(f"FAILED {failure}")
    requests = sum(r[5] for r in results)
    for node, n, _, node_cpu, _, node_requests in sorted(results, key=lambda r: -r[3])[:5]:
        print(f"slowest node {node}: {n} points, {node_requests} requests, {node_cpu:.2f} s CPU")
    print(f"agentic matrix: {done} run, {sum(reasons.values())} skipped, {len(failures)} "
          f"failed of {total} points in {wall:.1f} s wall, {cpu:.1f} s CPU over {jobs} "
          "processes")
    print(f"  {requests} requests simulated, {1e3 * cpu / max(requests, 1):.3f} ms CPU each")
    if sample > 1:
        print(f"  (every {sample}th node: the whole matrix is about {sample} times as much)")
    for reason, n in reasons.most_common():
        print(f"  {n} skipped: {reason}")
    print("load average at the end (1/5/15 min): "
          + " / ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 1 if failures else 0


def profile(tree: Path, points: int, duration: float) -> int:
    servers = agentic_servers(tree)
    jobs, n = [], 0
    for server in servers:  # whole nodes, until N points
        if n >= points:
            break
        jobs.append((server, duration))
        n += len(server.points())
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    results = [_run_node(job) for job in jobs]
    profiler.disable()
    print(f"{sum(r[1] for r in results)} points run, {sum(r[5] for r in results)} requests, "
          f"in {time.perf_counter() - t0:.1f} s (under the profiler)")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", nargs="?", type=Path, default=DEFAULT_TREE)
    parser.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--duration", type=float, default=LoadSettings().replay_duration_s,
                        help="replay seconds per point (default: the plugin's default)")
    parser.add_argument("--sample", type=int, default=1, metavar="K",
                        help="only every K-th node, largest first (an estimate of the whole)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile the nodes of the first N points in this process")
    args = parser.parse_args()
    if args.profile:
        return profile(args.tree, args.profile, args.duration)
    return run(args.tree, args.jobs, args.duration, args.sample)


if __name__ == "__main__":
    raise SystemExit(main())
