"""One closed-loop point in process and over HTTP, by three clients: does the server keep time?

The in-process driver (`sim.driver`, virtual time) predicts the point; the simulated server
(time scale 1) serves it to the project's client (`loadgen.client.run_load`), to the `openai`
async client driving the same closed loop (C workers, each sending its next request when its
last one ends), and, given its executable, to GuideLLM (`guidellm_client.py`). Each line is the
median/p99 TTFT, median/p99 TPOT and output throughput; the server's lines add their deviation
from the prediction. A third party's client keeps its own pace (GuideLLM sends a wave one
request at a time; the openai client's loop lags while it parses chunks into objects, and sends
a request's body tens of ms after its headers), so its line is held against its own send times
replayed in process. After each client, the server's own timeline says where the time went:
the request's trip in (and how much of it the body took), the server's TTFT from the engine
getting the request to its first chunk sent against the model's plan, and chunks' lateness
against the plan. Real-time numbers depend on the machine's load: the load average is printed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from pytest_inferbench.loadgen.client import ClientConfig, run_load
from pytest_inferbench.loadgen.connections import connection_slots
from pytest_inferbench.loadgen.prompts import render
from pytest_inferbench.loadgen.selfcheck import LoopMonitor, LoopStats
from pytest_inferbench.loadgen.workload import (
    LoadSettings,
    PlannedRequest,
    Workload,
    build_workload,
)
from pytest_inferbench.results.metrics import RequestRecord, summarize
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.driver import simulate_point
from pytest_inferbench.sim.server.launcher import running_sim_server

if TYPE_CHECKING:
    from pytest_inferbench.loadgen.prompts import RenderedWorkload
    from pytest_inferbench.sim.config import EngineConfig

HARDWARE = "MI355X"
NUM_GPUS = 4
KEYS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "output_throughput")


def _summary(records: Sequence[RequestRecord], duration_s: float, conc: int) -> dict[str, Any]:
    return summarize(records, duration_s=duration_s, num_prompts=len(records),
                     max_concurrency=conc, num_gpus=NUM_GPUS)


Measured = tuple[Sequence[RequestRecord], float, LoopStats]


async def _project_client(url: str, model: str, conc: int, rendered: RenderedWorkload
                          ) -> Measured:
    cfg = ClientConfig(base_url=url, model=model, concurrency=conc)
    async with connection_slots(cfg) as slots:
        await run_load(slots, cfg, rendered.warmup)
        monitor = LoopMonitor()
        monitor.start()
        start = time.perf_counter()
        run = await run_load(slots, cfg, rendered.prompts)
        duration = time.perf_counter() - start
        return run.records, duration, await monitor.stop()


async def _openai_client(url: str, model: str, conc: int, rendered: RenderedWorkload
                         ) -> Measured:
    from openai import AsyncOpenAI

    # Its own HTTP stack and connection pool (up to 1000 connections): a third party's client.
    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)

    async def one(text: str, isl: int, osl: int) -> RequestRecord:
        sent = time.perf_counter()
        times: list[float] = []
        response_id = ""
        stream = await client.completions.create(
            model=model, prompt=text, max_tokens=osl, stream=True,
            extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                times.append(time.perf_counter())
                response_id = chunk.id  # joins the server's timeline
        return RequestRecord(send_time=sent, end_time=time.perf_counter(), input_tokens=isl,
                             output_tokens=osl, success=bool(times),
                             chunk_times=np.asarray(times), request_id=response_id)

    async def closed_loop(prompts: Sequence[Any]) -> list[RequestRecord]:
        queue = list(reversed(prompts))
        out: list[RequestRecord] = []

        async def worker() -> None:
            while queue:
                p = queue.pop()
                out.append(await one(p.text, p.input_tokens, p.output_tokens))

        await asyncio.gather(*(worker() for _ in range(conc)))
        return out

    async with client:
        await closed_loop(rendered.warmup)
        monitor = LoopMonitor()
        monitor.start()
        start = time.perf_counter()
        records = await closed_loop(rendered.prompts)
        duration = time.perf_counter() - start
        return records, duration, await monitor.stop()


def _line(name: str, summary: dict[str, Any], reference: dict[str, Any] | None) -> str:
    cells = []
    for key in KEYS:
        cell = f"{summary[key]:9.2f}"
        if reference is not None:
            cell += f" ({(summary[key] / reference[key] - 1) * 100:+5.1f}%)"
        cells.append(cell)
    return f"  {name:18s}" + "  ".join(cells)


def _arrivals_of(records: Sequence[RequestRecord], workload: Workload) -> Workload:
    """The workload a client actually sent: its requests' lengths at its send times, each sent
    exactly then (the client kept its own concurrency; no warmup: the server was idle when the
    measured requests began)."""
    sent = sorted(records, key=lambda r: r.send_time)
    first = sent[0].send_time
    return dataclasses.replace(
        workload, warmup=(), send_offsets=tuple(r.send_time - first for r in sent),
        concurrency=len(sent),
        requests=tuple(PlannedRequest(r.input_tokens, r.output_tokens, text_key=i)
                       for i, r in enumerate(sent)))


def _server_view(base_url: str, records: Sequence[RequestRecord], client_clock: str) -> str:
    """Where the time went, from the server's own timeline of the measured requests: the trip
    in (client send to the engine getting the request, its body read and parsed) and the part
    of it the body took after the headers, the server's TTFT (from the engine getting it to the
    first chunk sent) against the model's plan, and chunks' lateness against the plan.
    `client_clock` is the clock of the records' times: "perf_counter" or "time" (wall)."""
    timeline = httpx.get(base_url + "/debug/inferbench/timeline").json()
    offset = {"perf_counter": timeline["perf_counter_minus_monotonic"],
              "time": timeline["wall_minus_monotonic"]}[client_clock]
    by_id = {t["id"]: t for t in timeline["requests"] if t["emissions"]}
    done = [by_id[r.request_id] for r in records if r.request_id in by_id]
    if not done:
        return f"  {'':18s}server side: no measured request found in the server's timeline"
    trip = np.asarray([by_id[r.request_id]["submitted"] + offset - r.send_time
                       for r in records if r.request_id in by_id]) * 1e3
    body = np.asarray([t["submitted"] - t["arrival"] for t in done]) * 1e3
    ttft = np.asarray([t["emissions"][0][0] - t["submitted"] for t in done]) * 1e3
    planned = np.asarray([t["planned"][0] - t["submitted"] for t in done]) * 1e3
    late = np.concatenate([np.asarray([e[0] for e in t["emissions"]]) - np.asarray(t["planned"])
                           for t in done]) * 1e3
    return (f"  {'':18s}server side ({len(done)} requests): trip in median {np.median(trip):.1f} "
            f"ms (body after headers {np.median(body):.1f} ms, p90 "
            f"{np.percentile(body, 90):.1f}); TTFT median {np.median(ttft):.1f} ms (model's "
            f"plan {np.median(planned):.1f}), p99 {np.percentile(ttft, 99):.1f} ms; chunks late "
            f"vs plan p50 {np.median(late):.1f} ms, p99 {np.percentile(late, 99):.1f} ms")


def _replayed(config: EngineConfig, records: Sequence[RequestRecord], workload: Workload,
              conc: int) -> dict[str, Any]:
    """The in-process prediction for the arrivals a client actually made."""
    own = simulate_point(config, _arrivals_of(records, workload))
    return _summary(own.records, own.duration_s, conc)


def compare(argv: Sequence[str], model: str, conc: int, isl: int, osl: int,
            prompts_per_conc: int, guidellm: str | None = None,
            clients: Sequence[str] = ("project", "openai")) -> None:
    load = LoadSettings(prompts_per_conc=prompts_per_conc, warmup_per_conc=1)
    workload = build_workload(isl, osl, conc, load)
    config, _ = engine_config_from_argv(list(argv), hardware=HARDWARE, env={})
    point = simulate_point(config, workload)
    reference = _summary(point.records, point.duration_s, conc)
    rendered = render(workload, None)
    print(f"conc {conc}, {isl}/{osl}, {len(workload.requests)} requests, "
          f"load average {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    print(f"  {'':18s}" + "  ".join(f"{k:>17s}" if i else f"{k:>9s}"
                                     for i, k in enumerate(KEYS)))
    print(_line("in-process sim", reference, None))
    for name, client in (("project", _project_client), ("openai", _openai_client)):
        if name not in clients:
            continue
        with running_sim_server(argv, ["--time-scale", "1"]) as server:
            records, duration, loop = asyncio.run(client(server.base_url, model, conc,
                                                         rendered))
            view = _server_view(server.base_url, records, "perf_counter")
        against = reference
        if name != "project":
            # A third party's closed loop runs at its own pace (the openai client's event loop
            # lags tens of ms parsing chunks into objects): held against its own arrivals.
            against = _replayed(config, records, workload, conc)
            print(_line("in-process, replay", against, None))
        print(_line(f"server, {name}", _summary(records, duration, conc), against))
        print(view, flush=True)
        lag_ms = np.percentile(loop.lag_s, [90, 99]) * 1e3 if loop.lag_s.size else (0.0, 0.0)
        print(f"  {'':18s}client self-check: event-loop lag p90 {lag_ms[0]:.1f} ms, "
              f"p99 {lag_ms[1]:.1f} ms; client CPU {loop.cpu_fraction:.0%} of one core")
    if guidellm is not None:
        from guidellm_client import guidellm_closed_loop

        with running_sim_server(argv, ["--time-scale", "1"]) as server:
            records, duration = guidellm_closed_loop(guidellm, server.base_url, model, conc,
                                                     rendered)
            view = _server_view(server.base_url, records, "time")
        # GuideLLM dispatches a wave one request at a time (~10 ms each here), so its point is
        # not the same closed loop: the reference is its own arrivals replayed in process.
        own_reference = _replayed(config, records, workload, conc)
        print(_line("in-process, replay", own_reference, None))
        print(_line("server, guidellm", _summary(records, duration, conc), own_reference))
        print(view, flush=True)
