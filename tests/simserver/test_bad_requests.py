"""Malformed requests get a 4xx with an OpenAI-style message; the server keeps serving."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from pytest_inferbench.loadgen.tokenizer import prompt_of_tokens

from .conftest import MODEL

if TYPE_CHECKING:
    from pytest_inferbench.sim.server.launcher import SimServer

GOOD = {"model": MODEL, "prompt": "hello there", "max_tokens": 4}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def with_(base: dict[str, Any], **changes: Any) -> bytes:
    return json.dumps({**base, **changes}).encode()


def without(base: dict[str, Any], key: str) -> bytes:
    return json.dumps({k: v for k, v in base.items() if k != key}).encode()


# (id, endpoint, raw body, status, text the message must contain)
CASES = [
    ("not-json", "/v1/completions", b"{model: x", 400, "not valid JSON"),
    ("empty-body", "/v1/completions", b"", 400, "body is empty"),
    ("json-array", "/v1/completions", b"[1, 2]", 400, "must be a JSON object"),
    ("missing-model", "/v1/completions", without(GOOD, "model"), 400, "'model'"),
    ("model-not-string", "/v1/completions", with_(GOOD, model=7), 400, "'model' must be"),
    ("unknown-model", "/v1/completions", with_(GOOD, model="other/model"), 404, "does not exist"),
    ("missing-prompt", "/v1/completions", without(GOOD, "prompt"), 400, "'prompt'"),
    ("prompt-wrong-type", "/v1/completions", with_(GOOD, prompt={"a": 1}), 400, "'prompt' must be"),
    ("empty-prompt", "/v1/completions", with_(GOOD, prompt="   "), 400, "prompt is empty"),
    ("max-tokens-string", "/v1/completions", with_(GOOD, max_tokens="4"), 400, "'max_tokens'"),
    ("max-tokens-zero", "/v1/completions", with_(GOOD, max_tokens=0), 400, "at least 1"),
    ("max-tokens-beyond-context", "/v1/completions", with_(GOOD, max_tokens=40000), 400,
     "maximum context length is 32768"),
    ("prompt-too-long", "/v1/completions", with_(GOOD, prompt=prompt_of_tokens(33000)), 400,
     "your prompt has 33000 tokens"),
    ("temperature-string", "/v1/completions", with_(GOOD, temperature="hot"), 400,
     "'temperature' must be a number"),
    ("n-two", "/v1/completions", with_(GOOD, n=2), 400, "'n' must be 1"),
    ("stream-not-bool", "/v1/completions", with_(GOOD, stream="yes"), 400, "'stream'"),
    ("stream-options-without-stream", "/v1/completions",
     with_(GOOD, stream_options={"include_usage": True}), 400, "only allowed when 'stream'"),
    ("stop-wrong-type", "/v1/completions", with_(GOOD, stop=5), 400, "'stop'"),
    ("batched-prompts", "/v1/completions", with_(GOOD, prompt=["a", "b"]), 400, "batched"),
    ("missing-messages", "/v1/chat/completions", without(CHAT, "messages"), 400, "'messages'"),
    ("messages-empty", "/v1/chat/completions", with_(CHAT, messages=[]), 400, "non-empty list"),
    ("bad-role", "/v1/chat/completions", with_(CHAT, messages=[{"role": "robot",
                                                                 "content": "x"}]),
     400, "role' must be one of"),
    ("content-wrong-type", "/v1/chat/completions",
     with_(CHAT, messages=[{"role": "user", "content": 3}]), 400, "messages[0].content"),
    ("chat-max-tokens-beyond-context", "/v1/chat/completions",
     with_(CHAT, max_completion_tokens=32768), 400, "maximum context length"),
    # Hostile bodies: deeper than the JSON reader goes, an integer too long to convert, bytes
    # that are not UTF-8.
    ("nested-100k-deep", "/v1/completions",
     b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nested too deeply"),
    ("max-tokens-100k-digits", "/v1/completions",
     b'{"model": "m", "prompt": "x", "max_tokens": 1' + b"0" * 100_000 + b"}", 400,
     "not valid JSON"),
    ("body-not-utf8", "/v1/completions", b'{"model": "\xff\xfe", "prompt": "x"}', 400,
     "not valid JSON"),
]


@pytest.mark.parametrize(("endpoint", "body", "status", "message"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_malformed_request_gets_a_clear_4xx(mtp_server: SimServer, endpoint: str, body: bytes,
                                            status: int, message: str) -> None:
    response = httpx.post(mtp_server.base_url + endpoint, content=body,
                          headers={"content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert message in error["message"]
    assert "Traceback" not in response.text


def test_unknown_route_and_method_are_json_errors(mtp_server: SimServer) -> None:
    missing = httpx.get(mtp_server.base_url + "/v1/nothing")
    assert missing.status_code == 404 and "Not Found" in missing.json()["error"]["message"]
    wrong = httpx.get(mtp_server.base_url + "/v1/completions")
    assert wrong.status_code == 405 and "Method Not Allowed" in wrong.json()["error"]["message"]


def test_server_keeps_serving_after_bad_requests(mtp_server: SimServer) -> None:
    for _, endpoint, body, _, _ in CASES:
        httpx.post(mtp_server.base_url + endpoint, content=body)
    assert httpx.get(mtp_server.base_url + "/health").json() == {"status": "ok"}
    response = httpx.post(mtp_server.base_url + "/v1/completions", json=GOOD)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
    assert mtp_server.process.poll() is None
    assert "Traceback" not in mtp_server.log_tail(lines=500)


@pytest.mark.parametrize("value", ["\u00b2".encode("latin-1"), "\u00b2".encode(), b"\xff",
                                   b"500\xb2", b"-1", b"99999999999999999999"])
def test_hostile_error_header_values_get_a_400(mtp_server: SimServer, value: bytes) -> None:
    response = httpx.post(mtp_server.base_url + "/v1/completions", json=GOOD,
                          headers={"X-Return-Error": value})
    assert response.status_code == 400, response.text
    assert "X-Return-Error must be an HTTP error status" in response.json()["error"]["message"]


@pytest.mark.parametrize("since", ["%C2%B2", "-1", "1e3", "%FF"])
def test_hostile_timeline_query_gets_a_400(mtp_server: SimServer, since: str) -> None:
    response = httpx.get(f"{mtp_server.base_url}/debug/inferbench/timeline?since={since}")
    assert response.status_code == 400, response.text
    assert "'since' must be a request id" in response.json()["error"]["message"]
