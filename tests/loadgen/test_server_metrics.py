"""Server-side metrics during a point: a server's latency histograms over the measured phase
(compared with the client's view) and its KV-cache usage sampled while the load runs, against
the simulated server under the vLLM persona (which exports vLLM's TTFT/ITL/E2E histograms)."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from pytest_inferbench.backends.base import LoadSettings
from pytest_inferbench.backends.http import HttpServerHandle
from pytest_inferbench.backends.http_replay import run_replay_point
from pytest_inferbench.frameworks import registry
from pytest_inferbench.loadgen.scrape import Snapshot, parse_exposition, point_metrics, scrape
from pytest_inferbench.loadgen.synthetic_traces import (
    SyntheticTraceSettings,
    write_synthetic_traces,
)
from pytest_inferbench.recipe.launch import ClientOptions, ServerSpec
from pytest_inferbench.recipe.model import Parallelism, SeqLenSweep, ServerConfig
from pytest_inferbench.report import result_properties
from pytest_inferbench.results.build import build_result
from pytest_inferbench.results.record import mapping, number
from pytest_inferbench.results.server_latency import HistogramDelta, client_vs_server
from pytest_inferbench.sim.server.launcher import running_sim_server

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pytest_inferbench.results.measurement import PointMeasurement
    from pytest_inferbench.sim.server.launcher import SimServer

MODEL = "amd/MiniMax-M3-MXFP4"
VLLM_ARGV = ("vllm", "serve", MODEL, "--port", "8000", "--tensor-parallel-size", "4",
             "--max-model-len", "32768", "--max-num-seqs", "256", "--block-size", "128")
VLLM = registry.get("vllm")
TTFT_NAME = VLLM.latency_histograms["ttft"]
# A point whose TTFTs fall in one of vLLM's wide TTFT buckets (a 4k-token prefill at conc 8 on
# the simulated MI355X takes a few hundred ms), short enough to run in a few seconds.
ISL, OSL, CONC, PROMPTS_PER_CONC = 4096, 32, 8, 2


def vllm_point(scenario: str = "fixed-seq-len") -> tuple[ServerSpec, ServerConfig]:
    spec = ServerSpec(
        image="sim", argv=VLLM_ARGV, env=(), port=0, health_path="/health",
        startup_timeout_s=30, gpu_count=4, served_model=MODEL, hardware="MI355X",
        framework="vllm", client=ClientOptions(use_chat_template=False),
        launch_file=Path("sim.yaml"))
    key = "minimaxm3-fp4-mi355x-vllm" + ("-agentic" if scenario != "fixed-seq-len" else "")
    server = ServerConfig(
        config_key=key, image="sim", model=MODEL, model_prefix="minimaxm3", runner="mi355x",
        hardware="MI355X", precision="fp4", framework="vllm", multinode=False, disagg=False,
        parallel=Parallelism(tp=4), spec_decoding="none",
        sweeps=(SeqLenSweep(ISL, OSL, (CONC,), 1),), source=Path("server-metrics.yaml"),
        line=1, scenario=scenario)
    return spec, server


@pytest.fixture(scope="module")
def vllm_server() -> Iterator[SimServer]:
    """Real time (time scale 1): the histograms hold timings the client can compare with."""
    with running_sim_server(VLLM_ARGV, ["--time-scale", "1"]) as server:
        yield server


@pytest.fixture(scope="module")
def measured(vllm_server: SimServer) -> tuple[ServerConfig, PointMeasurement]:
    spec, server = vllm_point()
    handle = HttpServerHandle(base_url=vllm_server.base_url, spec=spec, simulated=True,
                              time_scale=1.0)
    return server, handle.run_point(server.points()[0],
                                    LoadSettings(prompts_per_conc=PROMPTS_PER_CONC))


def exposition(observations: dict[str, list[float]], name: str = TTFT_NAME) -> str:
    """A real prometheus_client histogram under vLLM's name (its TTFT's unless `name` says),
    one label set per engine."""
    registry_ = CollectorRegistry()
    hist = Histogram(name.removesuffix("_seconds"), "ttft", ["model_name", "engine"],
                     unit="seconds", registry=registry_, buckets=(0.1, 0.2, 0.4, 0.8))
    for engine, values in observations.items():
        for value in values:
            hist.labels("m", engine).observe(value)
    return generate_latest(registry_).decode()


def snapshot(text: str) -> Snapshot:
    parsed = parse_exposition(text)
    return Snapshot(parsed.counters, parsed.gauges, histograms=parsed.histograms)


def test_histogram_delta_counts_only_what_happened_between_the_scrapes() -> None:
    earlier = {"0": [0.05, 0.3], "1": [0.7]}
    during = {"0": [0.15, 0.15, 0.25], "1": [0.12, 0.35, 0.6]}
    before = snapshot(exposition(earlier))
    after = snapshot(exposition({e: earlier[e] + during[e] for e in earlier}))
    ttft = mapping(point_metrics(before, after)["latency_histograms"])["ttft"]
    assert isinstance(ttft, dict)
    values = [v for vs in during.values() for v in vs]  # both engines, this point only
    assert ttft["metric"] == TTFT_NAME
    assert ttft["count"] == len(values)
    assert ttft["mean_s"] == pytest.approx(statistics.mean(values))
    # The median estimate lies in the bucket that holds the true median.
    lower, upper = ttft["median_bucket_s"]
    assert lower <= statistics.median(values) <= upper
    assert lower <= ttft["median_s"] <= upper


def test_vllm_tpot_histogram_is_compared_with_the_clients_tpot() -> None:
    """vLLM's per-request TPOT histogram (decode time / (output tokens - 1), the client's TPOT
    statistic) is kept over the point and set against the client's mean and median TPOT."""
    name = VLLM.latency_histograms["tpot"]
    assert name == "vllm:request_time_per_output_token_seconds"
    during = [0.15, 0.25, 0.3]
    before = snapshot(exposition({"0": [0.7]}, name))
    after = snapshot(exposition({"0": [0.7, *during]}, name))
    latency = mapping(point_metrics(before, after)["latency_histograms"])
    tpot = mapping(latency["tpot"])
    assert tpot["count"] == len(during)
    assert tpot["mean_s"] == pytest.approx(statistics.mean(during))
    client = {"mean_tpot_ms": 250.0, "median_tpot_ms": 240.0}
    compared = client_vs_server(client, latency)
    assert compared["mean_tpot_ms"] == pytest.approx(250.0 - 1e3 * statistics.mean(during))
    # Prometheus-style: the median (rank 1.5 of 3) lies in the (0.2, 0.4] bucket, which
    # holds ranks 1 to 3, interpolated: 0.2 + 0.2 * (1.5 - 1) / 2 = 0.25 s.
    assert tpot["median_s"] == pytest.approx(0.25)
    assert compared["median_tpot_ms"] == pytest.approx(240.0 - 250.0)


def test_quantile_interpolates_as_prometheus_histogram_quantile() -> None:
    # 100 observations in (1, 2]: Prometheus assumes them spread evenly over the bucket.
    hist = HistogramDelta(((1.0, 0.0), (2.0, 100.0), (float("inf"), 100.0)), 100.0, 150.0)
    assert hist.quantile(0.5) == pytest.approx(1.5)
    assert hist.quantile(0.9) == pytest.approx(1.9)
    assert hist.mean_s == pytest.approx(1.5)
    # A quantile in +Inf: the largest finite bound, as Prometheus answers; none observed: None.
    beyond = HistogramDelta(((1.0, 10.0), (float("inf"), 30.0)), 30.0, 90.0)
    assert beyond.quantile(0.5) == 1.0 and beyond.quantile_bucket(0.5) is None
    assert HistogramDelta(((1.0, 0.0),), 0.0, 0.0).quantile(0.5) is None


def test_server_histograms_cover_the_measured_phase_only(
        measured: tuple[ServerConfig, PointMeasurement]) -> None:
    _, m = measured
    latency = mapping(m.server_metrics["latency_histograms"])
    requests = len(m.records)
    assert requests == CONC * PROMPTS_PER_CONC and all(r.success for r in m.records)
    # The warmup (as many requests again) ran before the first scrape: not counted.
    for quantity in ("ttft", "e2e"):
        assert mapping(latency[quantity])["count"] == requests
    # One ITL observation per chunk after each request's first: the client saw the same chunks.
    assert mapping(latency["itl"])["count"] == sum(len(r.chunk_times) - 1 for r in m.records)


def test_client_and_server_ttft_agree_within_the_median_bucket(
        measured: tuple[ServerConfig, PointMeasurement]) -> None:
    server, m = measured
    record = build_result(server.points()[0], m, spec=None, backend="sim-server")
    ttft = mapping(mapping(mapping(record["server_metrics"])["latency_histograms"])["ttft"])
    lower, upper = (float(b) for b in ttft["median_bucket_s"])  # type: ignore[union-attr]
    # The server's median estimate and its true median lie in that bucket, so they differ by
    # less than its width; the client's TTFT of a request is the server's plus the loopback
    # transport and the client's own scheduling, milliseconds next to a bucket hundreds of ms
    # wide. So the client's median is within one bucket width of the server's estimate.
    delta_ms = number(record["client_minus_server_median_ttft_ms"])
    assert delta_ms is not None
    assert abs(delta_ms) <= (upper - lower) * 1000.0
    assert record["median_ttft_ms"] == pytest.approx(
        number(ttft["median_s"]) * 1000.0 + delta_ms)  # type: ignore[operator]
    # The server's mean is exact (sum / count over the same requests), and every request's
    # first token reached the client after the server sent it, from a send before the server
    # saw the request: the client's mean cannot be the smaller.
    compared = mapping(record["client_vs_server_ms"])
    assert number(compared["mean_ttft_ms"]) >= 0  # type: ignore[operator]
    properties = dict(result_properties(record))
    assert properties["client_minus_server_median_ttft_ms"] == pytest.approx(delta_ms, abs=1e-6)
    assert "client_minus_server_median_itl_ms" in properties


def test_kv_usage_is_sampled_while_the_load_runs(
        measured: tuple[ServerConfig, PointMeasurement]) -> None:
    _, m = measured
    metrics = m.server_metrics
    assert metrics["kv_cache_usage_gauge"] == VLLM.metrics["kv_usage"]
    assert metrics["kv_cache_usage_samples"] >= 1  # type: ignore[operator]
    peak, mean = number(metrics["kv_cache_usage_peak"]), number(metrics["kv_cache_usage_mean"])
    assert peak is not None and mean is not None
    # The requests held KV blocks while they ran; read after the point the cache is empty.
    assert peak > 0
    assert 0 < mean <= peak <= 1
    assert "kv_cache_usage" not in metrics  # no longer the idle server's gauge after the point


def test_kv_usage_is_sampled_during_an_agentic_replay(vllm_server: SimServer,
                                                      tmp_path: Path) -> None:
    spec, server = vllm_point("agentic-coding")
    handle = HttpServerHandle(base_url=vllm_server.base_url, spec=spec, simulated=True,
                              time_scale=1.0)
    point = dataclasses.replace(server.points()[0], conc=4)
    # No think time between turns: every lane has a request in flight whenever it is sampled.
    traces = write_synthetic_traces(tmp_path, SyntheticTraceSettings(seed=0, think_time_s=0))
    m = run_replay_point(handle, point, LoadSettings(replay_duration_s=2.0, traces=traces))
    assert m.records and all(r.success for r in m.records)
    metrics = m.server_metrics
    peak, mean = number(metrics["kv_cache_usage_peak"]), number(metrics["kv_cache_usage_mean"])
    assert peak is not None and mean is not None
    assert 0 < mean <= peak <= 1
    # The scrapes bracket the profiling phase: the server's histogram counts its requests.
    profiled = [r for r in m.records if not r.warmup]
    assert mapping(mapping(metrics["latency_histograms"])["ttft"])["count"] == len(profiled)


def test_sglang_histograms_are_read_under_its_registry_names() -> None:
    """The names are the registry entry's: the SGLang persona exports its own, and the scraper
    finds them without naming a framework."""
    sglang = registry.get("sglang")
    argv = ("python", "-m", "sglang.launch_server", "--model-path", MODEL, "--port", "30000",
            "--tp", "4")
    requests = 3

    async def measure(base_url: str) -> dict[str, object]:
        async with httpx.AsyncClient(base_url=base_url) as client:
            before = await scrape(client)
            for _ in range(requests):
                response = await client.post("/v1/completions", json={
                    "model": MODEL, "prompt": "a b c d", "max_tokens": 8, "ignore_eos": True,
                    "stream": True})
                assert response.status_code == 200
            return dict(point_metrics(before, await scrape(client)))

    with running_sim_server(argv, ["--time-scale", "0"]) as server:
        metrics = asyncio.run(measure(server.base_url))
    latency = mapping(metrics["latency_histograms"])  # type: ignore[arg-type]
    for quantity, name in sglang.latency_histograms.items():
        assert mapping(latency[quantity])["metric"] == name
    assert mapping(latency["ttft"])["count"] == requests
