"""How accurate and how fast is the load generator on this machine? Prints figures; asserts nothing.

1. Timing error: the client against the simulated server (ATOM persona, MiniMax-M3, EAGLE3 k=3)
   at time scale 1, concurrency 256, ISL/OSL 1024 by default. Every chunk's client stamp is
   compared with the server's emission time for it (`/debug/inferbench/timeline`, same clock),
   and the TTFT/TPOT/per-token ITL medians with the server's. The server's TTFT is taken from
   the client's wire time and, second, from the server's own arrival stamp (which comes after
   the server read and parsed the request).
2. Chunk rate: the same client against the simulator at time scale 0 (tokens as fast as the
   server can send them), with the client's CPU time per chunk, so the client's ceiling on one
   core is 1 / (CPU per chunk) even where the server, sharing the machine, was the bottleneck.
3. `metrics.summarize` cost on the run's records and on 3000 records x 1000 chunks.

    python benchmarks/bench_client_timing.py [--conc 256] [--isl 1024] [--osl 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from pytest_inferbench.backends.base import LoadSettings
from pytest_inferbench.backends.http import HttpServerHandle
from pytest_inferbench.loadgen.affinity import pinned_to_one_cpu
from pytest_inferbench.loadgen.client import ClientConfig, run_load
from pytest_inferbench.loadgen.connections import connection_slots
from pytest_inferbench.loadgen.prompts import render
from pytest_inferbench.loadgen.workload import build_workload
from pytest_inferbench.recipe.launch import ClientOptions, ServerSpec
from pytest_inferbench.recipe.model import Parallelism, SeqLenSweep, ServerConfig
from pytest_inferbench.results.metrics import RequestRecord, summarize
from pytest_inferbench.sim.server.launcher import running_sim_server

MODEL = "amd/MiniMax-M3-MXFP4"
ARGV = ("python3", "-m", "atom.entrypoints.openai_server", "--model", MODEL, "--server-port",
        "8888", "-tp", "4", "--block-size", "128", "--max-model-len", "32768",
        "--max-num-batched-tokens", "32768", "--max-num-seqs", "256", "--kv_cache_dtype", "fp8",
        "--method", "eagle3", "--draft-model", "Inferact/MiniMax-M3-EAGLE3",
        "--num-speculative-tokens", "3")


def spec() -> ServerSpec:
    return ServerSpec(image="sim", argv=ARGV, env=(), port=0, health_path="/health",
                      startup_timeout_s=60, gpu_count=4, served_model=MODEL, hardware="MI355X",
                      framework="atom", client=ClientOptions(use_chat_template=True),
                      launch_file=Path("bench"))


def server(isl: int, osl: int, conc: int) -> ServerConfig:
    return ServerConfig(
        config_key="minimaxm3-fp4-mi355x-atom-mtp", image="sim", model=MODEL,
        model_prefix="minimaxm3", runner="mi355x", hardware="MI355X", precision="fp4",
        framework="atom", multinode=False, disagg=False, parallel=Parallelism(tp=4),
        spec_decoding="mtp", sweeps=(SeqLenSweep(isl, osl, (conc,), 1),), source=Path("bench"),
        line=1)


def pct(values: np.ndarray[Any, Any], qs: tuple[float, ...] = (50, 99, 100)) -> str:
    return " / ".join(f"{v:.3f}" for v in np.percentile(values, qs))


def timing_error(args: argparse.Namespace) -> None:
    print(f"== timing error: conc {args.conc}, ISL {args.isl}, OSL {args.osl}, time scale 1")
    with running_sim_server(ARGV, ["--time-scale", "1"], timeout_s=60) as sim:
        handle = HttpServerHandle(base_url=sim.base_url, spec=spec(), simulated=True)
        point = server(args.isl, args.osl, args.conc).points()[0]
        load = LoadSettings(prompts_per_conc=args.prompts_per_conc,
                            warmup_per_conc=args.warmup_per_conc)
        started = time.perf_counter()
        m = handle.run_point(point, load)
        wall = time.perf_counter() - started
        timeline = httpx.get(sim.base_url + "/debug/inferbench/timeline", timeout=60).json()
    offset = float(timeline["perf_counter_minus_monotonic"])
    by_id = {t["id"]: t for t in timeline["requests"]}
    delays, ttft, ttft_arrival, tpot, gaps, tokens = [], [], [], [], [], []
    for r in m.records:
        if not r.success:
            continue
        emitted = np.asarray(by_id[r.request_id]["emissions"], dtype=np.float64)
        times, counts = emitted[:, 0] + offset, emitted[:, 1].astype(np.int64)
        delays.append(r.chunk_times - times)
        ttft.append(times[0] - r.send_time)
        ttft_arrival.append(times[0] - (by_id[r.request_id]["arrival"] + offset))
        n = int(counts.sum())
        if n > 1:
            tpot.append((times[-1] - times[0]) / (n - 1))
        gaps.append(np.diff(times))
        tokens.append(counts[1:])
    s = summarize(m.records, duration_s=m.duration_s, num_prompts=m.num_prompts,
                  max_concurrency=args.conc, num_gpus=4)
    g, t = np.concatenate(gaps), np.concatenate(tokens)
    server_token_itl = float(np.median(np.repeat(g / t, t))) * 1000
    d = np.concatenate(delays) * 1000
    chunks = int(s["total_chunks"])

    def row(name: str, client: float, truth: float) -> None:
        print(f"  {name:<22} client {client:10.3f} ms  server {truth:10.3f} ms  "
              f"error {100 * (client - truth) / truth:+.2f}%")

    print(f"  {s['completed']} completed, {s['failed']} failed, {chunks} chunks in "
          f"{m.duration_s:.1f} s ({chunks / m.duration_s:,.0f} chunks/s sustained); "
          f"wall with warmup {wall:.1f} s; AL {m.server_metrics.get('acceptance_length')}")
    row("median TTFT", s["median_ttft_ms"], float(np.median(ttft)) * 1000)
    row("  vs server arrival", s["median_ttft_ms"], float(np.median(ttft_arrival)) * 1000)
    row("median TPOT", s["median_tpot_ms"], float(np.median(tpot)) * 1000)
    row("median per-token ITL", s["median_itl_per_token_ms"], server_token_itl)
    print(f"  chunk stamp - server emission (ms) p50 / p99 / max: {pct(d)}")
    c = m.client_check
    print(f"  self-check ok={c['ok']} lag p50/p90/p99/max {c['lag_p50_ms']:.2f} / "
          f"{c['lag_p90_ms']:.2f} / {c['lag_p99_ms']:.2f} / {c['lag_max_ms']:.2f} ms, "
          f"dispatch delay p50 {c['dispatch_delay_p50_ms']:.2f} ms, client CPU "
          f"{c['cpu_fraction']:.0%} {c['reason']}")
    records: list[RequestRecord] = list(m.records)
    started = time.perf_counter()
    summarize(records, duration_s=m.duration_s, num_prompts=m.num_prompts,
              max_concurrency=args.conc, num_gpus=4)
    print(f"  summarize() on these {len(records)} records / {chunks} chunks: "
          f"{(time.perf_counter() - started) * 1000:.1f} ms")


def chunk_rate(args: argparse.Namespace) -> None:
    print(f"== chunk rate: conc {args.conc}, OSL {args.osl}, time scale 0 (server flat out)")
    with running_sim_server(ARGV, ["--time-scale", "0"], timeout_s=60) as sim:
        cfg = ClientConfig(base_url=sim.base_url, model=MODEL, concurrency=args.conc)
        prompts = render(build_workload(128, args.osl, args.conc,
                                        LoadSettings(prompts_per_conc=1, range_ratio=1.0))).prompts

        async def go() -> tuple[float, float, int]:
            async with connection_slots(cfg) as slots:
                await run_load(slots, cfg, prompts[: args.conc // 4 or 1])  # connect, warm
                cpu0, wall0 = time.process_time(), time.perf_counter()
                run = await run_load(slots, cfg, prompts)
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            return cpu, wall, sum(len(r.chunk_times) for r in run.records if r.success)

        with pinned_to_one_cpu():  # as run_point does
            cpu, wall, chunks = asyncio.run(go())
    per_chunk_us = cpu / chunks * 1e6
    print(f"  {chunks} chunks in {wall:.2f} s = {chunks / wall:,.0f} chunks/s "
          f"(client CPU {cpu / wall:.0%} of one core, {os.cpu_count()} cores shared with the "
          f"server)")
    print(f"  client CPU per chunk {per_chunk_us:.1f} us (parsing included) -> at most "
          f"~{1e6 / per_chunk_us:,.0f} chunks/s on one core")


def summarize_cost() -> None:
    rng = np.random.default_rng(0)
    records = []
    for i in range(3000):
        toks = rng.integers(1, 5, 1000)
        t = i * 0.01 + 0.1 + np.cumsum(rng.uniform(0.005, 0.02, 1000))
        records.append(RequestRecord(i * 0.01, float(t[-1]), 1000, int(toks.sum()), True, t,
                                     toks))
    best = min(_timed(records) for _ in range(3))
    print(f"== summarize(): 3000 records x 1000 chunks (1-4 tokens each): {best:.0f} ms")


def _timed(records: list[RequestRecord]) -> float:
    started = time.perf_counter()
    summarize(records, duration_s=100.0, num_prompts=3000, max_concurrency=256, num_gpus=4)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conc", type=int, default=256)
    p.add_argument("--isl", type=int, default=1024)
    p.add_argument("--osl", type=int, default=1024)
    p.add_argument("--prompts-per-conc", type=int, default=1)
    p.add_argument("--warmup-per-conc", type=int, default=0)
    p.add_argument("--skip-timing", action="store_true")
    args = p.parse_args()
    if not args.skip_timing:
        timing_error(args)
    chunk_rate(args)
    summarize_cost()


if __name__ == "__main__":
    main()
