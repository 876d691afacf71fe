"""Request options the server honours: stop strings, token-id prompts, usage, defaults."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from pytest_inferbench.loadgen.tokenizer import count_tokens, filler_tokens
from pytest_inferbench.sim.server.openai_api import GenerationRequest
from pytest_inferbench.sim.server.streaming import Generation, _choice, _sse
from pytest_inferbench.sim.server.timeline import RequestTrace

from .conftest import MODEL

if TYPE_CHECKING:
    from pytest_inferbench.sim.server.launcher import SimServer
    from pytest_inferbench.sim.server.openai_api import Kind


def post(server: SimServer, body: dict[str, Any], path: str = "/v1/completions") -> Any:
    response = httpx.post(server.base_url + path, json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    return response.json()


def stream_events(server: SimServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", server.base_url + "/v1/completions",
                      json={"model": MODEL, "stream": True, **body}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    return events


def test_stop_string_ends_the_text_before_it(mtp_server: SimServer) -> None:
    # Filler cycles through its whole vocabulary, so any of its words shows up within one cycle.
    vocabulary = sorted({t.strip() for t in filler_tokens(500, "any")})
    for stop_word in (vocabulary[0], vocabulary[-1]):
        body = post(mtp_server, {"prompt": "a", "max_tokens": 100, "stop": [" " + stop_word]})
        choice = body["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert stop_word not in choice["text"].split()
        shown = count_tokens(choice["text"])
        assert shown < len(vocabulary)
        # The token that completed the stop string was generated, so it is counted.
        assert body["usage"]["completion_tokens"] == shown + 1


def test_token_id_prompt_counts_one_token_per_id(mtp_server: SimServer) -> None:
    body = post(mtp_server, {"prompt": list(range(300)), "max_tokens": 2})
    assert body["usage"]["prompt_tokens"] == 300


def test_continuous_usage_is_cumulative_per_chunk(mtp_server: SimServer) -> None:
    events = stream_events(mtp_server, {
        "prompt": "x y", "max_tokens": 30, "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    content = [e for e in events if e["choices"]]
    counts = [e["usage"]["completion_tokens"] for e in content]
    assert counts == sorted(counts) and counts[-1] == 30
    previous = 0
    for event, count in zip(content, counts, strict=True):
        assert count_tokens(event["choices"][0]["text"]) == count - previous
        previous = count
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 30


def test_completion_default_is_sixteen_tokens(mtp_server: SimServer) -> None:
    body = post(mtp_server, {"prompt": "x"})
    assert body["usage"]["completion_tokens"] == 16
    assert body["choices"][0]["finish_reason"] == "length"


def test_chat_accepts_text_parts_and_tool_only_assistant_turns(mtp_server: SimServer) -> None:
    body = post(mtp_server, {"max_tokens": 3, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "two words"}]},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "go"}]}, path="/v1/chat/completions")
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["prompt_tokens"] == (2 + 2) + (2 + 0) + (2 + 1) + 1


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_a_pre_rendered_text_chunk_is_the_chunk_encoded_whole(kind: Kind) -> None:
    request = GenerationRequest(
        kind=kind, model='org/"quoted" model \u00e9', prompt_text="", prompt_tokens=1,
        max_tokens=4, stream=True, include_usage=False, continuous_usage=False,
        ignore_eos=True, temperature=0.0, stop=())
    trace = RequestTrace(0, "cmpl-0123", 0.0, 1, 4)
    gen = Generation(request, None, None, trace, None, 1_700_000_000)  # type: ignore[arg-type]
    for text in ["plain", ' "quoted" \\ back\nslash \u2028 \u00e9 \U0001f600', ""]:
        whole = _sse(gen.envelope([_choice(gen, text, None)], chunk=True))
        assert gen.text_event(text) == whole
