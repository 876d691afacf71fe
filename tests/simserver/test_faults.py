"""Every fault-injection mode, observed from the outside over real HTTP."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from pytest_inferbench.loadgen.tokenizer import count_tokens
from pytest_inferbench.sim.server.faults import FAULT_EXIT_CODE

from .conftest import ATOM_MTP_ARGV, FAST, MODEL

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_inferbench.sim.server.launcher import SimServer


def completion(max_tokens: int = 16, stream: bool = True) -> dict[str, object]:
    return {"model": MODEL, "prompt": "count with me", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": stream, "stream_options": {"include_usage": True}
            if stream else None}


def read_stream(base_url: str, read_timeout: float = 30.0) -> tuple[list[str], str | None]:
    """(data payloads received, the exception that ended reading, if any)."""
    payloads: list[str] = []
    timeout = httpx.Timeout(5.0, read=read_timeout)
    try:
        with httpx.stream("POST", base_url + "/v1/completions", json=completion(),
                          timeout=timeout) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    payloads.append(line[6:])
    except httpx.HTTPError as exc:
        return payloads, type(exc).__name__
    return payloads, None


def streamed_tokens(payloads: list[str]) -> int:
    events = [json.loads(p) for p in payloads if p != "[DONE]"]
    return sum(count_tokens(e["choices"][0]["text"]) for e in events if e["choices"])


def test_startup_delay_answers_503_then_becomes_healthy(
        start_server: Callable[..., SimServer]) -> None:
    server = start_server(ATOM_MTP_ARGV, (*FAST, "--startup-delay", "2"), wait=False)
    early = httpx.get(server.base_url + "/health")
    assert early.status_code == 503
    assert "loading" in early.json()["message"]
    refused = httpx.post(server.base_url + "/v1/completions", json=completion(stream=False))
    assert refused.status_code == 503
    assert "loading" in refused.json()["error"]["message"]
    server.wait_healthy(timeout_s=30)
    assert httpx.post(server.base_url + "/v1/completions",
                      json=completion(stream=False)).status_code == 200


def test_never_ready_stays_503(start_server: Callable[..., SimServer]) -> None:
    server = start_server(ATOM_MTP_ARGV, (*FAST, "--never-ready"), wait=False)
    deadline = time.monotonic() + 1.0
    codes = set()
    while time.monotonic() < deadline:
        codes.add(httpx.get(server.base_url + "/health").status_code)
        time.sleep(0.1)
    assert codes == {503}
    assert "never become ready" in httpx.get(server.base_url + "/health").json()["message"]
    assert server.process.poll() is None


def test_error_rate_answers_http_500_with_an_error_body(
        start_server: Callable[..., SimServer]) -> None:
    server = start_server(ATOM_MTP_ARGV, (*FAST, "--error-rate", "0.5", "--seed", "7"))
    codes = []
    for _ in range(30):
        response = httpx.post(server.base_url + "/v1/completions", json=completion(stream=False))
        codes.append(response.status_code)
        if response.status_code == 500:
            assert "fault injection" in response.json()["error"]["message"]
    assert set(codes) == {200, 500}
    assert httpx.get(server.base_url + "/health").status_code == 200


def test_truncate_rate_cuts_streams_without_done(start_server: Callable[..., SimServer]) -> None:
    server = start_server(ATOM_MTP_ARGV, (*FAST, "--truncate-rate", "1"))
    payloads, error = read_stream(server.base_url)
    assert error is None  # the body ends cleanly, but early
    assert "[DONE]" not in payloads
    assert not any("usage" in json.loads(p) for p in payloads)
    assert streamed_tokens(payloads) == 16 // 2
    (record,) = httpx.get(server.base_url + "/debug/inferbench/timeline").json()["requests"]
    assert record["outcome"] == "truncated"
    assert record["id"] == json.loads(payloads[0])["id"]


def test_stall_after_tokens_stops_sending_but_keeps_the_connection(
        start_server: Callable[..., SimServer]) -> None:
    server = start_server(ATOM_MTP_ARGV, (*FAST, "--stall-after-tokens", "5"))
    payloads, error = read_stream(server.base_url, read_timeout=2.0)
    assert error == "ReadTimeout"  # still open, silent
    assert "[DONE]" not in payloads
    assert streamed_tokens(payloads) == 5
    # The engine keeps serving: a non-streamed request completes.
    plain = httpx.post(server.base_url + "/v1/completions", json=completion(stream=False))
    assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 16


def test_fail_after_requests_exits_mid_sweep(start_server: Callable[..., SimServer]) -> None:
    server = start_server(ATOM_MTP_ARGV, (*FAST, "--fail-after-requests", "3"))
    for _ in range(3):
        response = httpx.post(server.base_url + "/v1/completions", json=completion(stream=False))
        assert response.status_code == 200
    assert server.process.wait(timeout=10) == FAULT_EXIT_CODE
    assert "--fail-after-requests" in server.log_tail()
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.base_url + "/health")


def test_return_error_header_gives_that_exact_status(
        start_server: Callable[..., SimServer]) -> None:
    server = start_server(ATOM_MTP_ARGV, FAST)
    for status in (429, 503):
        response = httpx.post(server.base_url + "/v1/completions", json=completion(stream=False),
                              headers={"X-Return-Error": str(status)})
        assert response.status_code == status
        assert "X-Return-Error" in response.json()["error"]["message"]
    bad = httpx.post(server.base_url + "/v1/completions", json=completion(stream=False),
                     headers={"X-Return-Error": "teapot"})
    assert bad.status_code == 400 and "400-599" in bad.json()["error"]["message"]
    assert httpx.post(server.base_url + "/v1/completions",
                      json=completion(stream=False)).status_code == 200
