"""SGLang persona with `SGLANG_SIMULATE_ACC_LEN` in the server's environment: over HTTP, the
acceptance length the server reports (`sglang:spec_accept_length`) is the pinned one."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

import httpx
import pytest

from pytest_inferbench.loadgen.tokenizer import prompt_of_tokens
from pytest_inferbench.sim.server.launcher import launch

from .conftest import FAST, MODEL
from .promtext import scrape, value

if TYPE_CHECKING:
    from pathlib import Path

PINNED = 3.39  # InferenceX's SGLang Qwen3.5 recipes; not the golden AL of this draft
SGLANG_ARGV = ("python3", "-m", "sglang.launch_server", "--model-path", MODEL, "--tp", "4",
               "--speculative-algorithm", "EAGLE3",
               "--speculative-draft-model-path", "Inferact/MiniMax-M3-EAGLE3",
               "--speculative-num-steps", "3")
CONCURRENCY = 16
OUTPUT_TOKENS = 128


async def _complete(client: httpx.AsyncClient, index: int) -> None:
    body = {"model": MODEL, "prompt": prompt_of_tokens(300, seed=index),
            "max_tokens": OUTPUT_TOKENS, "ignore_eos": True}
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == OUTPUT_TOKENS


async def _sweep(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        await asyncio.gather(*(_complete(client, i) for i in range(CONCURRENCY)))


def test_sglang_simulated_acceptance_length_over_http(tmp_path: Path) -> None:
    env = {**os.environ, "SGLANG_SIMULATE_ACC_LEN": str(PINNED)}
    server = launch(SGLANG_ARGV, FAST, env=env, log_dir=tmp_path)
    try:
        server.wait_healthy(timeout_s=60)
        asyncio.run(_sweep(server.base_url))
        reported = value(scrape(server.base_url), "sglang:spec_accept_length")
    finally:
        server.stop()
    assert reported == pytest.approx(PINNED, rel=0.01)
