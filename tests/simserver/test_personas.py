"""vLLM and SGLang argv: persona picked from the program, their metric names, served-model-name."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from .conftest import ATOM_ARGV
from .promtext import scrape, value

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_inferbench.sim.server.launcher import SimServer

MODEL = "amd/MiniMax-M3-MXFP4"
SPEC = '{"method": "eagle3", "model": "Inferact/MiniMax-M3-EAGLE3", "num_speculative_tokens": 3}'
VLLM_ARGV = ("vllm", "serve", MODEL, "--port", "8000", "--tensor-parallel-size", "4",
             "--max-model-len", "32768", "--max-num-seqs", "256", "--block-size", "128",
             "--kv-cache-dtype", "fp8", "--speculative-config", SPEC,
             "--served-model-name", "m3", "m3-alias")
SGLANG_ARGV = ("python", "-m", "sglang.launch_server", "--model-path", MODEL, "--port", "30000",
               "--tp", "4", "--context-length", "16384")
FAST = ("--time-scale", "0")


def test_vllm_persona_exposes_spec_decode_counters(
        start_server: Callable[..., SimServer]) -> None:
    server = start_server(VLLM_ARGV, FAST)
    models = httpx.get(server.base_url + "/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["m3", "m3-alias"]
    for _ in range(4):
        response = httpx.post(server.base_url + "/v1/completions", json={
            "model": "m3-alias", "prompt": "a b c d", "max_tokens": 40, "ignore_eos": True})
        assert response.status_code == 200
    samples = scrape(server.base_url)
    assert value(samples, "vllm:generation_tokens_total") == 4 * 40
    assert value(samples, "vllm:prompt_tokens_total") == 4 * 4
    assert value(samples, "vllm:num_requests_running") == 0
    assert value(samples, "vllm:num_requests_waiting") == 0
    assert 0 <= value(samples, "vllm:kv_cache_usage_perc") <= 1
    drafts = value(samples, "vllm:spec_decode_num_drafts_total")
    assert value(samples, "vllm:spec_decode_num_draft_tokens_total") == 3 * drafts
    accepted = value(samples, "vllm:spec_decode_num_accepted_tokens_total")
    per_position = [value(samples, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                          position=str(p)) for p in range(3)]
    assert sum(per_position) == accepted
    assert per_position == sorted(per_position, reverse=True)  # a later draft needs the earlier
    # Each request: one prefill token, then one verify step per later chunk.
    timeline = httpx.get(server.base_url + "/debug/inferbench/timeline").json()["requests"]
    assert drafts == sum(len(r["emissions"]) - 1 for r in timeline)
    assert not any(name.startswith("atom:") for name, _ in samples)
    # Server-side latency histograms: one TTFT and one E2E per request, one ITL per later chunk.
    assert value(samples, "vllm:time_to_first_token_seconds_count") == 4
    assert value(samples, "vllm:e2e_request_latency_seconds_count") == 4
    assert value(samples, "vllm:inter_token_latency_seconds_count") == drafts
    e2e = sum(r["finish"] - r["arrival"] for r in timeline)
    assert value(samples, "vllm:e2e_request_latency_seconds_sum") == pytest.approx(e2e)
    assert value(samples, "vllm:time_to_first_token_seconds_bucket", le="+Inf") == 4


def test_sglang_persona_and_context_length(start_server: Callable[..., SimServer]) -> None:
    server = start_server(SGLANG_ARGV, FAST)
    info = httpx.get(server.base_url + "/debug/inferbench/info").json()
    assert (info["persona"], info["max_model_len"], info["simulated"]) == ("sglang", 16384, True)
    too_long = httpx.post(server.base_url + "/v1/completions", json={
        "model": MODEL, "prompt": "x", "max_tokens": 16384})
    assert too_long.status_code == 400
    httpx.post(server.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x y"})
    samples = scrape(server.base_url)
    assert value(samples, "sglang:generation_tokens_total") == 16  # completions default
    assert value(samples, "sglang:num_running_reqs") == 0
    assert value(samples, "sglang:num_preemptions_total") == 0


def test_persona_option_overrides_the_program(start_server: Callable[..., SimServer]) -> None:
    server = start_server(SGLANG_ARGV, (*FAST, "--persona", "vllm"))
    names = {name for name, _ in scrape(server.base_url)}
    assert "vllm:num_requests_running" in names
    assert not any(name.startswith("sglang:") for name in names)


def test_gauges_show_the_live_batch_and_queue(start_server: Callable[..., SimServer]) -> None:
    argv = [*ATOM_ARGV]
    argv[argv.index("--max-num-seqs") + 1] = "2"
    server = start_server(argv, ("--time-scale", "1"))

    async def run() -> tuple[float, float, float]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            body = {"model": MODEL, "prompt": "a b", "max_tokens": 300, "ignore_eos": True}
            tasks = [asyncio.create_task(client.post("/v1/completions", json=body))
                     for _ in range(4)]
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                samples = scrape(server.base_url)
                running = value(samples, "atom:requests_running")
                waiting = value(samples, "atom:requests_waiting")
                if running + waiting == 4:
                    break
                await asyncio.sleep(0.05)
            usage = value(samples, "atom:kv_cache_usage_ratio")
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return running, waiting, usage

    running, waiting, usage = asyncio.run(run())
    assert (running, waiting) == (2, 2)
    assert usage > 0
