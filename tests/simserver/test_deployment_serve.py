"""A disaggregated deployment served behind one OpenAI-compatible endpoint: the official
`openai` client and the project's own client (a multinode recipe on the external backend)
get answers, and `/metrics` says what each role did."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

from pytest_inferbench.loadgen.tokenizer import count_tokens, prompt_of_tokens

from .promtext import scrape, value

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_inferbench.sim.server.launcher import SimServer

MODEL = "amd/MiniMax-M3-MXFP4"
WORKER = ("vllm", "serve", MODEL, "--tensor-parallel-size", "4", "--kv-cache-dtype", "fp8",
          "--block-size", "128", "--max-model-len", "10000")
DEPLOYMENT = ("--hardware", "MI355X", "--time-scale", "0", "--prefill-workers", "2",
              "--decode-workers", "1", "--router", "load-aware")


def role_values(server: SimServer, name: str) -> dict[str, float]:
    return {dict(labels)["role"]: v for (sample, labels), v in scrape(server.base_url).items()
            if sample == name}


def test_the_openai_client_gets_answers_and_metrics_say_what_each_role_did(
        start_server: Callable[..., SimServer]) -> None:
    server = start_server((*WORKER, "--", *WORKER), DEPLOYMENT)
    info = httpx.get(server.base_url + "/debug/inferbench/info", trust_env=False).json()
    assert info["deployment"]["topology"] == "p2x4-d1x4"
    assert info["deployment"]["kv_transfer"]["fabric"] == "rdma"  # 12 GPUs: two nodes
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    prompts = (37, 300, 1200)
    for n in prompts:
        stream = client.completions.create(
            model=MODEL, prompt=prompt_of_tokens(n), max_tokens=9, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        chunks = list(stream)
        usage = chunks[-1].usage
        assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (n, 9)
        assert count_tokens("".join(c.choices[0].text for c in chunks if c.choices)) == 9
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.usage is not None and chat.usage.completion_tokens == 4
    total_prompt = sum(prompts) + chat.usage.prompt_tokens
    # The prefill pool computed every prompt and sampled each first token; the decode pool
    # streamed every token; each request's KV cache moved once.
    assert role_values(server, "inferbench:deployment_prompt_tokens_total")[
        "prefill"] == total_prompt
    generated = role_values(server, "inferbench:deployment_generation_tokens_total")
    assert generated == {"prefill": 4.0, "decode": 3 * 9 + 4.0}
    assert role_values(server, "inferbench:deployment_workers") == {"prefill": 2.0,
                                                                     "decode": 1.0}
    samples = scrape(server.base_url)
    assert value(samples, "inferbench:kv_transfers_total") == 4.0
    # The persona's own families are the deployment's totals.
    assert value(samples, "vllm:generation_tokens_total") == 3 * 9 + 4.0
    assert value(samples, "vllm:prompt_tokens_total") == total_prompt


RECIPE = """\
minimaxm3-fp4-mi355x-vllm-disagg:
  image: img
  model: amd/MiniMax-M3-MXFP4
  model-prefix: minimaxm3
  runner: mi355x-disagg
  precision: fp4
  framework: vllm-disagg
  multinode: true
  disagg: true
  scenarios:
    fixed-seq-len:
      - isl: 1024
        osl: 64
        search-space:
          - conc-list: [4]
            prefill: { num-worker: 2, tp: 4, ep: 1, dp-attn: false }
            decode: { num-worker: 1, tp: 4, ep: 1, dp-attn: false }
"""


def test_the_project_client_benchmarks_the_deployment_as_an_external_server(
        start_server: Callable[..., SimServer], pytester: pytest.Pytester) -> None:
    server = start_server((*WORKER, "--", *WORKER), DEPLOYMENT)
    pytester.makefile(".yaml", **{"amd-master": RECIPE})
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--inferbench-backend", "external",
        f"--inferbench-base-url={server.base_url}", "--inferbench-prompts-per-conc", "2",
        "--inferbench-no-plots")
    result.assert_outcomes(passed=1)
    [point] = json.loads((pytester.path / "inferbench-results" / "summary.json").read_text()
                         )["points"]
    assert "p2x4-d1x4" in point["nodeid"]
    [raw_path] = [path for path in (pytester.path / "inferbench-results" / "points").glob("*.json")
                  if not path.name.startswith("agg_")]
    raw = json.loads(raw_path.read_text())
    assert raw["completed"] == 8 + 0 and raw["inferbench"]["simulated"] is True
    assert raw["inferbench"]["is_multinode"] is True
    # What the server says it did, beside what the client measured: the roles' counters.
    generated = role_values(server, "inferbench:deployment_generation_tokens_total")
    assert generated["decode"] >= raw["total_output_tokens"]
