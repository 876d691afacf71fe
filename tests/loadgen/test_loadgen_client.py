"""The client against the real simulated server (time scale 0: as fast as it can)."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from typing import TYPE_CHECKING

import httpx
import pytest

from pytest_inferbench.backends.base import LoadSettings, ServerDiedError
from pytest_inferbench.backends.http import HttpServerHandle
from pytest_inferbench.loadgen.client import ClientConfig, Timeouts, run_load
from pytest_inferbench.loadgen.connections import connection_slots
from pytest_inferbench.loadgen.prompts import render
from pytest_inferbench.loadgen.workload import build_workload
from pytest_inferbench.results.measurement import SIMULATED_NOTE
from pytest_inferbench.results.metrics import summarize
from pytest_inferbench.sim.server.launcher import running_sim_server

if TYPE_CHECKING:
    import types

    from pytest_inferbench.sim.server.launcher import SimServer


def handle_for(server: SimServer, helpers: types.ModuleType, *, chat_template: bool = True,
               endpoint: str = "/v1/completions") -> HttpServerHandle:
    spec = helpers.spec_for((*helpers.ATOM_ARGV, *helpers.EAGLE3), chat_template=chat_template)
    spec = dataclasses.replace(spec, client=dataclasses.replace(spec.client, endpoint=endpoint))
    return HttpServerHandle(base_url=server.base_url, spec=spec, simulated=True)


def test_token_accounting_is_exact(fast_server: SimServer, helpers: types.ModuleType) -> None:
    httpx.delete(fast_server.base_url + "/debug/inferbench/timeline")
    point = helpers.server_config("mtp", isl=96, osl=40, conc=8).points()[0]
    m = handle_for(fast_server, helpers).run_point(point, LoadSettings(prompts_per_conc=3))
    s = summarize(m.records, duration_s=m.duration_s, num_prompts=m.num_prompts,
                  max_concurrency=8, num_gpus=4)
    assert s["completed"] == 24 and s["failed"] == 0
    timeline = httpx.get(fast_server.base_url + "/debug/inferbench/timeline").json()
    served = {t["id"]: t["completion_tokens"] for t in timeline["requests"]}
    # Every request: server usage == tokens streamed == tokens the engine emitted.
    for r in m.records:
        assert r.output_tokens == int(r.chunk_tokens.sum()) == served[r.request_id]
        assert r.token_source == "usage"
    assert s["total_output_tokens"] == s["chunk_token_total"] == sum(
        served[r.request_id] for r in m.records)
    assert s["token_accounting_ok"]
    assert m.client_check["prompt_tokens"]["mismatched_requests"] == 0
    assert s["total_input_tokens"] == m.client_check["prompt_tokens"]["expected"]
    assert s["mean_tokens_per_chunk"] > 1.5  # EAGLE3 sends several tokens per step
    assert m.server_metrics["acceptance_length"] > 1.5
    assert m.server_metrics["acceptance_length_source"] in ("atom:mtp_*", "/debug/mtp_stats")
    assert m.simulated and SIMULATED_NOTE in m.notes  # the one wording, as the sim backend's


def test_chat_endpoint_without_client_template(fast_server: SimServer,
                                               helpers: types.ModuleType) -> None:
    point = helpers.server_config("mtp", isl=64, osl=16, conc=4).points()[0]
    handle = handle_for(fast_server, helpers, endpoint="/v1/chat/completions")
    m = handle.run_point(point, LoadSettings(prompts_per_conc=2))
    assert all(r.success for r in m.records), [r.error for r in m.records]
    # The server templates chat messages itself: 2 + words + 1 tokens per prompt.
    check = m.client_check["prompt_tokens"]
    assert check["chat_template"] is False
    assert check["reported"] == check["expected"] + 3 * len(m.records)
    assert all(int(r.chunk_tokens.sum()) == r.output_tokens for r in m.records)


def test_open_loop_follows_the_schedule(fast_server: SimServer,
                                        helpers: types.ModuleType) -> None:
    point = helpers.server_config("mtp", isl=32, osl=8, conc=4).points()[0]
    load = LoadSettings(prompts_per_conc=5, request_rate=100.0)
    m = handle_for(fast_server, helpers).run_point(point, load)
    assert len(m.records) == 20 and all(r.success for r in m.records)
    scheduled = sorted(r.scheduled_time for r in m.records if r.scheduled_time is not None)
    assert len(scheduled) == 20
    # No request goes out before its time.
    assert all(r.dispatch_time is not None and r.scheduled_time is not None
               and r.dispatch_time >= r.scheduled_time for r in m.records)


def test_failed_and_truncated_streams_are_counted_with_reasons(helpers: types.ModuleType) -> None:
    options = ["--time-scale", "0", "--error-rate", "0.3", "--truncate-rate", "0.3", "--seed", "4"]
    with running_sim_server((*helpers.ATOM_ARGV, *helpers.EAGLE3), options) as server:
        point = helpers.server_config("mtp", isl=32, osl=16, conc=8).points()[0]
        m = handle_for(server, helpers).run_point(point, LoadSettings(prompts_per_conc=5))
    s = summarize(m.records, duration_s=m.duration_s, num_prompts=m.num_prompts,
                  max_concurrency=8, num_gpus=4)
    assert s["completed"] + s["failed"] == m.num_prompts == 40  # nothing dropped
    assert s["failed"] > 0 and s["completed"] > 0
    errors = s["errors"]
    assert errors.get("stream ended without [DONE]", 0) > 0
    http_500 = [e for e in errors if e.startswith("HTTP 500: simulated internal server error")]
    assert http_500, errors
    assert sum(errors.values()) == s["failed"]


def test_a_stalled_stream_times_out_with_a_reason(helpers: types.ModuleType) -> None:
    options = ["--time-scale", "0", "--stall-after-tokens", "3"]
    with running_sim_server((*helpers.ATOM_ARGV, *helpers.EAGLE3), options) as server:
        cfg = ClientConfig(base_url=server.base_url, model=helpers.MODEL, concurrency=2,
                           timeouts=Timeouts(read_s=0.5))
        prompts = render(build_workload(16, 8, 2, LoadSettings(prompts_per_conc=1))).prompts

        async def go() -> list[str]:
            async with connection_slots(cfg) as slots:
                run = await run_load(slots, cfg, prompts)
            return [r.error for r in run.records]

        errors = asyncio.run(go())
    assert errors == ["no data for 0.5 s after token 3 (--inferbench-stall-timeout)"] * 2


class _WatchedHandle(HttpServerHandle):
    """What the process backend adds: a liveness check on the real server process."""

    def __init__(self, server: SimServer, helpers: types.ModuleType) -> None:
        base = handle_for(server, helpers)
        super().__init__(base_url=base.base_url, spec=base.spec, simulated=True)
        self.server = server

    def check_alive(self) -> None:
        try:  # a server whose sockets are closed may need a moment to finish exiting
            code: int | None = self.server.process.wait(2.0)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            raise ServerDiedError(f"server exited with {code}; log:\n{self.server.log_tail()}")


def test_a_dead_server_is_reported_not_counted(helpers: types.ModuleType) -> None:
    # Real time, so the sweep is still running when the server exits (0.1 s after request 6).
    options = ["--time-scale", "1", "--fail-after-requests", "6"]
    with running_sim_server((*helpers.ATOM_ARGV, *helpers.EAGLE3), options) as server:
        handle = _WatchedHandle(server, helpers)
        point = helpers.server_config("mtp", isl=16, osl=16, conc=2).points()[0]
        with pytest.raises(ServerDiedError, match="server exited"):
            handle.run_point(point, LoadSettings(prompts_per_conc=10))
