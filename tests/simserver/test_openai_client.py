"""The official `openai` client against the simulator: models, streamed chat and completion."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import openai
import pytest

from pytest_inferbench.loadgen.tokenizer import (
    chat_prompt_tokens,
    count_tokens,
    prompt_of_tokens,
    render_chat,
)

from .conftest import MODEL

if TYPE_CHECKING:
    from pytest_inferbench.sim.server.launcher import SimServer


@pytest.fixture(scope="module")
def client(mtp_server: SimServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=mtp_server.base_url + "/v1", api_key="unused", max_retries=0)


def test_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_streams_a_chat_completion_with_usage(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "name three prime numbers"}]
    stream = client.chat.completions.create(  # type: ignore[call-overload]
        model=MODEL, messages=messages, max_completion_tokens=12, stream=True,
        stream_options={"include_usage": True}, temperature=0.0)
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert content[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in content)
    assert content[-1].choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.completion_tokens == 12 == count_tokens(text)
    pairs = [(m["role"], m["content"]) for m in messages]
    assert usage.prompt_tokens == chat_prompt_tokens(pairs) == count_tokens(render_chat(pairs))
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_streams_a_completion_with_usage(client: openai.OpenAI) -> None:
    prompt = prompt_of_tokens(37)
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=20, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (37, 20)
    assert count_tokens(text) == 20


def test_plain_completion_and_chat(client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt="one two three", max_tokens=5)
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    assert count_tokens(completion.choices[0].text) == 5
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.choices[0].message.content is not None
    assert count_tokens(chat.choices[0].message.content) == 4
    assert chat.usage is not None and chat.usage.prompt_tokens == 2 + 1 + 1


def test_client_sees_an_openai_error_for_an_unknown_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="no/such-model", prompt="x", max_tokens=1)


def test_every_response_says_it_is_simulated(mtp_server: SimServer) -> None:
    response = httpx.get(mtp_server.base_url + "/v1/models")
    assert response.headers["x-inferbench-simulated"] == "true"
    completion = httpx.post(mtp_server.base_url + "/v1/completions",
                            json={"model": MODEL, "prompt": "x", "max_tokens": 1})
    assert completion.headers["x-request-id"] == completion.json()["id"]
    assert "SIMULATED" in mtp_server.log_tail()
