"""The simulated SGLang server with HiCache over HTTP: prompts HBM let go of are found in the
CPU-DRAM tier, `/metrics` counts them under SGLang's labelled `cached_tokens` series, and the
scraper reports them as the point's KV tiers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from pytest_inferbench.loadgen.scrape import Snapshot, parse_metrics, point_metrics
from pytest_inferbench.loadgen.tokenizer import prompt_of_tokens
from pytest_inferbench.sim.server.launcher import launch

from .conftest import FAST, MODEL
from .promtext import samples_of

if TYPE_CHECKING:
    from pathlib import Path

PAGE = 64
# A KV pool of 32 pages: one 20-page prompt fits, three do not stay.
SGLANG_ARGV = ("python3", "-m", "sglang.launch_server", "--model-path", MODEL, "--tp", "4",
               "--page-size", str(PAGE), "--max-total-tokens", str(32 * PAGE))
HICACHE = ("--enable-hierarchical-cache", "--hicache-size", "10")
PROMPTS = [prompt_of_tokens(20 * PAGE + 5, seed=100 + i) for i in range(3)]


def _run(argv: tuple[str, ...], tmp_path: Path) -> tuple[str, str]:
    """/metrics before and after sending the three prompts twice, one after another."""
    server = launch(argv, FAST, log_dir=tmp_path)
    try:
        server.wait_healthy(timeout_s=60)
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            before = client.get("/metrics").text
            for prompt in PROMPTS * 2:
                body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "ignore_eos": True}
                assert client.post("/v1/completions", json=body).status_code == 200
            after = client.get("/metrics").text
    finally:
        server.stop()
    return before, after


def test_prompts_evicted_from_hbm_are_host_hits_under_sglangs_names(tmp_path: Path) -> None:
    before, after = _run((*SGLANG_ARGV, *HICACHE), tmp_path)
    samples = samples_of(after)
    host = samples[("sglang:cached_tokens_total", (("cache_source", "host"),))]
    device = samples[("sglang:cached_tokens_total", (("cache_source", "device"),))]
    # The second round finds each prompt's whole pages (all but the last token) in DRAM.
    assert host == len(PROMPTS) * 20 * PAGE
    assert device == 0  # the pool held none of them by then
    assert samples[("sglang:hicache_host_total_tokens", ())] > 0
    assert samples[("sglang:hicache_host_used_tokens", ())] >= len(PROMPTS) * 20 * PAGE
    tiers = point_metrics(Snapshot(*parse_metrics(before)), Snapshot(*parse_metrics(after)))
    assert tiers["kv_tiers"] == {
        "device_cache_hits": 0.0, "host_cache_hits": host, "hbm_hit_tokens": 0.0,
        "dram_hit_tokens": host,
        "host_tokens_used": samples[("sglang:hicache_host_used_tokens", ())],
        "host_tokens_total": samples[("sglang:hicache_host_total_tokens", ())]}


def test_without_hicache_no_tier_is_exported(tmp_path: Path) -> None:
    before, after = _run(SGLANG_ARGV, tmp_path)
    assert "sglang:cached_tokens" not in after and "hicache" not in after
    assert "kv_tiers" not in point_metrics(Snapshot(*parse_metrics(before)),
                                           Snapshot(*parse_metrics(after)))
