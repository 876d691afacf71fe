"""The simulated vLLM server's prefix cache over HTTP: prompts that open with the same text
find its full blocks cached, and `/metrics` counts the queried and hit prompt tokens under
vLLM's names."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from pytest_inferbench.loadgen.tokenizer import count_tokens, prompt_of_tokens
from pytest_inferbench.sim.server.launcher import launch

from .conftest import FAST, MODEL
from .promtext import scrape, value

if TYPE_CHECKING:
    from pathlib import Path

BLOCK = 64
VLLM_ARGV = ("vllm", "serve", MODEL, "--tensor-parallel-size", "4", "--block-size", str(BLOCK))
SHARED = prompt_of_tokens(5 * BLOCK + 10, seed=7)  # five whole blocks and part of a sixth


def _prompts() -> list[str]:
    return [f"{SHARED} {prompt_of_tokens(40 + i, seed=1000 + 13 * i)}" for i in range(6)]


def _counters(argv: tuple[str, ...], tmp_path: Path) -> tuple[float, float]:
    server = launch(argv, FAST, log_dir=tmp_path)
    try:
        server.wait_healthy(timeout_s=60)
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            for prompt in _prompts():  # one after another: each finds the ones before cached
                body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "ignore_eos": True}
                assert client.post("/v1/completions", json=body).status_code == 200
        samples = scrape(server.base_url)
    finally:
        server.stop()
    return (value(samples, "vllm:prefix_cache_queries_total"),
            value(samples, "vllm:prefix_cache_hits_total"))


def test_shared_opening_blocks_are_hits_in_metrics(tmp_path: Path) -> None:
    queries, hits = _counters(VLLM_ARGV, tmp_path)
    prompts = _prompts()
    assert queries == sum(count_tokens(p) for p in prompts)
    # The first prompt computes everything; each later one finds the blocks wholly inside
    # the shared opening (the block the opening ends in holds the prompt's own words too).
    assert hits == (len(prompts) - 1) * (count_tokens(SHARED) // BLOCK) * BLOCK


def test_without_prefix_caching_nothing_is_looked_up(tmp_path: Path) -> None:
    queries, hits = _counters((*VLLM_ARGV, "--no-enable-prefix-caching"), tmp_path)
    assert (queries, hits) == (0, 0)
