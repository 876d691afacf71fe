"""ATOM persona + EAGLE3 at concurrency 64: multi-token chunks, counters that match the timeline."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import httpx
import pytest

from pytest_inferbench.loadgen.tokenizer import count_tokens, prompt_of_tokens
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.engine import Engine

from .conftest import ATOM_MTP_ARGV, MODEL
from .promtext import scrape, value

if TYPE_CHECKING:
    from pytest_inferbench.sim.server.launcher import SimServer

CONCURRENCY = 64
OUTPUT_TOKENS = 256
K = 3


async def _stream(client: httpx.AsyncClient, index: int) -> tuple[str, list[int]]:
    """(response id, tokens per content chunk) of one streamed completion."""
    body = {"model": MODEL, "prompt": prompt_of_tokens(200 + index, seed=index),
            "max_tokens": OUTPUT_TOKENS, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    chunk_tokens: list[int] = []
    response_id = ""
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            response_id = event["id"]
            if event["choices"]:
                chunk_tokens.append(count_tokens(event["choices"][0]["text"]))
    return response_id, chunk_tokens


async def _sweep(base_url: str) -> list[tuple[str, list[int]]]:
    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60) as client:
        return await asyncio.gather(*(_stream(client, i) for i in range(CONCURRENCY)))


@pytest.fixture(scope="module")
def sweep(mtp_server: SimServer) -> dict[str, object]:
    """Counters before and after one concurrency-64 streaming sweep, and what the client saw."""
    url = mtp_server.base_url
    before = scrape(url)
    since = httpx.get(url + "/debug/inferbench/timeline").json()["requests"]
    first_id = max((r["request_id"] for r in since), default=-1) + 1
    streams = asyncio.run(_sweep(url))
    after = scrape(url)
    timeline = httpx.get(url + "/debug/inferbench/timeline",
                         params={"since": first_id}).json()["requests"]
    return {"before": before, "after": after, "streams": streams, "timeline": timeline,
            "mtp": httpx.get(url + "/debug/mtp_stats").json()}


def _delta(sweep: dict[str, object], name: str, **labels: str) -> float:
    after, before = sweep["after"], sweep["before"]
    return value(after, name, **labels) - value(before, name, **labels)  # type: ignore[arg-type]


def test_eagle3_steps_arrive_as_multi_token_chunks(sweep: dict[str, object]) -> None:
    streams = sweep["streams"]
    assert isinstance(streams, list) and len(streams) == CONCURRENCY
    for _, chunks in streams:
        assert sum(chunks) == OUTPUT_TOKENS
        assert max(chunks) > 1 and max(chunks) <= K + 1


def test_counters_match_the_timeline(sweep: dict[str, object]) -> None:
    timeline = sweep["timeline"]
    assert isinstance(timeline, list) and len(timeline) == CONCURRENCY
    assert {r["outcome"] for r in timeline} == {"finished"}
    streams = dict(sweep["streams"])  # type: ignore[call-overload]
    for record in timeline:
        assert [n for _, n in record["emissions"]] == streams[record["id"]]
    tokens = sum(r["completion_tokens"] for r in timeline)
    # The first token of each request comes from its prefill step; every later emission is
    # one sequence's verify step, which drafted K tokens.
    verify_steps = sum(len(r["emissions"]) - 1 for r in timeline)
    assert _delta(sweep, "atom:generation_tokens_total") == tokens == CONCURRENCY * OUTPUT_TOKENS
    assert _delta(sweep, "atom:prompt_tokens_total") == sum(r["prompt_tokens"] for r in timeline)
    assert _delta(sweep, "atom:requests_finished_total") == CONCURRENCY
    assert _delta(sweep, "atom:mtp_draft_tokens_total") == K * verify_steps
    histogram = [_delta(sweep, "atom:mtp_decode_steps_total", accepted_tokens=str(a))
                 for a in range(K + 1)]
    assert sum(histogram) == verify_steps


def test_accepted_over_drafts_reproduces_the_configured_acceptance_length(
        sweep: dict[str, object]) -> None:
    config, _ = engine_config_from_argv(ATOM_MTP_ARGV, hardware="MI355X")
    distribution = Engine(config).accepted_distribution
    configured = 1.0 + sum(a * p for a, p in enumerate(distribution))
    drafts = _delta(sweep, "atom:mtp_draft_tokens_total") / K
    measured = 1.0 + _delta(sweep, "atom:mtp_accepted_tokens_total") / drafts
    assert measured == pytest.approx(configured, rel=0.02)


def test_mtp_stats_agree_with_metrics(sweep: dict[str, object]) -> None:
    mtp, after = sweep["mtp"], sweep["after"]
    assert isinstance(mtp, dict) and mtp["enabled"] is True
    assert mtp["total_draft_tokens"] == value(after, "atom:mtp_draft_tokens_total")  # type: ignore[arg-type]
    assert mtp["total_accepted_tokens"] == value(after, "atom:mtp_accepted_tokens_total")  # type: ignore[arg-type]
    assert mtp["acceptance_rate"] == pytest.approx(
        value(after, "atom:mtp_acceptance_rate"))  # type: ignore[arg-type]
    assert mtp["average_tokens_per_forward"] == pytest.approx(
        value(after, "atom:mtp_average_tokens_per_forward"))  # type: ignore[arg-type]
    for accepted, steps in mtp["distribution"].items():
        assert steps == value(after, "atom:mtp_decode_steps_total",  # type: ignore[arg-type]
                              accepted_tokens=accepted)
    verify_steps = sum(mtp["distribution"].values())
    assert mtp["average_tokens_per_forward"] == pytest.approx(
        1 + mtp["total_accepted_tokens"] / verify_steps)
