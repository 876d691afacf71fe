"""How faithfully the simulated HTTP server keeps the engine's timeline, and how fast it can go.

    python benchmarks/bench_sim_server.py [--concurrency 1 16 64] [--output-tokens 256]
    python benchmarks/bench_sim_server.py --compare [--concurrency 64 256] [--guidellm EXE]

Starts `python -m pytest_inferbench.sim serve` with the ATOM MiniMax-M3 + EAGLE3 argv on
MI355X and, for each concurrency, streams that many completions at once. It prints:

* server lateness: each emission's send time minus the time the engine model planned for it
  (`/debug/inferbench/timeline`, `emissions` vs `planned`), i.e. how far the event loop fell
  behind the simulated step timeline on this machine;
* client lag: when the client read each chunk minus when the server sent it (both on the
  system-wide monotonic clock);
* at time scale 0, the server's ceiling in SSE chunks and tokens per second.

With `--compare` it runs one closed-loop point (ISL/OSL, `--prompts-per-conc` x conc requests
after one warmup request per slot) in process (`sim.driver`, virtual time) and against the
server at time scale 1, measured by the project's client, by the `openai` async client and
(`--guidellm`) by GuideLLM,
and prints median/p99 TTFT, TPOT and output throughput with the server's deviation from the
in-process prediction.

Numbers depend on the machine's load; they are printed, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
import numpy as np

from pytest_inferbench.loadgen.tokenizer import prompt_of_tokens
from pytest_inferbench.sim.server.launcher import running_sim_server

MODEL = "amd/MiniMax-M3-MXFP4"
ATOM_MTP_ARGV = (
    "python3", "-m", "atom.entrypoints.openai_server", "--model", MODEL, "--server-port", "8888",
    "-tp", "4", "--block-size", "128", "--gpu-memory-utilization", "0.8", "--max-model-len",
    "32768", "--max-num-batched-tokens", "32768", "--max-num-seqs", "256", "--kv_cache_dtype",
    "fp8", "--trust-remote-code", "--no-enable_prefix_caching", "--method", "eagle3",
    "--draft-model", "Inferact/MiniMax-M3-EAGLE3", "--num-speculative-tokens", "3",
)


async def _stream(client: httpx.AsyncClient, index: int, isl: int, osl: int
                  ) -> tuple[str, list[float]]:
    body = {"model": MODEL, "prompt": prompt_of_tokens(isl, seed=index), "max_tokens": osl,
            "ignore_eos": True, "stream": True}
    response_id, arrivals = "", []
    async with client.stream("POST", "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                stamp = time.monotonic()
                event = json.loads(line[6:])
                response_id = event["id"]
                if event["choices"]:
                    arrivals.append(stamp)
    return response_id, arrivals


async def _burst(base_url: str, concurrency: int, isl: int, osl: int
                 ) -> list[tuple[str, list[float]]]:
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=600) as client:
        return await asyncio.gather(*(_stream(client, i, isl, osl) for i in range(concurrency)))


def _ms(values: list[float]) -> str:
    a = np.asarray(values) * 1e3
    return (f"p50 {np.percentile(a, 50):7.2f}  p99 {np.percentile(a, 99):7.2f}  "
            f"max {a.max():7.2f} ms")


def real_time(concurrencies: list[int], isl: int, osl: int) -> None:
    with running_sim_server(ATOM_MTP_ARGV, ["--time-scale", "1"]) as server:
        for conc in concurrencies:
            first = len(httpx.get(server.base_url + "/debug/inferbench/timeline").json()[
                "requests"])
            start = time.monotonic()
            streams = dict(asyncio.run(_burst(server.base_url, conc, isl, osl)))
            wall = time.monotonic() - start
            records = httpx.get(server.base_url + "/debug/inferbench/timeline").json()[
                "requests"][first:]
            late, lag = [], []
            for record in records:
                sent = [t for t, _ in record["emissions"]]
                late += [s - p for s, p in zip(sent, record["planned"], strict=True)]
                lag += [c - s for c, s in zip(streams[record["id"]], sent, strict=True)]
            planned_span = max(r["planned"][-1] for r in records) - min(
                r["arrival"] for r in records)
            print(f"conc {conc:4d}: {len(late):6d} chunks in {wall:6.2f} s "
                  f"(model span {planned_span:6.2f} s)")
            print(f"    server lateness vs model: {_ms(late)}")
            print(f"    client lag after send   : {_ms(lag)}")


def ceiling(conc: int, isl: int, osl: int) -> None:
    with running_sim_server(ATOM_MTP_ARGV, ["--time-scale", "0"]) as server:
        start = time.monotonic()
        streams = asyncio.run(_burst(server.base_url, conc, isl, osl))
        wall = time.monotonic() - start
    chunks = sum(len(a) for _, a in streams)
    print(f"time scale 0, conc {conc}: {chunks / wall:8.0f} chunks/s, "
          f"{conc * osl / wall:8.0f} tokens/s (server and client share this machine)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=None)
    parser.add_argument("--input-tokens", type=int, default=1024)
    parser.add_argument("--output-tokens", type=int, default=None)
    parser.add_argument("--compare", action="store_true",
                        help="in-process simulation vs the server, two clients")
    parser.add_argument("--prompts-per-conc", type=int, default=3)
    parser.add_argument("--clients", nargs="*", choices=("project", "openai"),
                        default=["project", "openai"],
                        help="with --compare, the in-process clients to run (default both; "
                             "none given: only --guidellm)")
    parser.add_argument("--guidellm", metavar="EXECUTABLE", default=None,
                        help="with --compare, also measure with GuideLLM (its own venv's "
                             "`guidellm`; see benchmarks/guidellm_client.py)")
    args = parser.parse_args()
    if args.compare:
        from bench_sim_compare import compare

        for conc in args.concurrency or [64, 256]:
            compare(ATOM_MTP_ARGV, MODEL, conc, args.input_tokens, args.output_tokens or 1024,
                    args.prompts_per_conc, args.guidellm, args.clients)
        return
    args.concurrency = args.concurrency or [1, 16, 64]
    args.output_tokens = args.output_tokens or 256
    print("SIMULATED server (no GPU): timing fidelity of the HTTP layer, time scale 1")
    real_time(args.concurrency, args.input_tokens, args.output_tokens)
    ceiling(max(args.concurrency), args.input_tokens, args.output_tokens)


if __name__ == "__main__":
    main()
