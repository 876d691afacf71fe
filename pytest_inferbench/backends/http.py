"""`run_point` for every server reached over HTTP (docker, process, external, sim-server).

One point: warmup (excluded), then the measured load with its progress line inside the measured
phase's bracket (`measured.py`: scrapes before and after, event-loop monitor, KV usage sampled
during the load), then the self-check verdict. Subclasses add how the
server is started, watched and stopped; when requests fail, `check_alive()` turns a dead
server into `ServerDiedError` with its log tail instead of a page of failed requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import TYPE_CHECKING

from ..loadgen.affinity import Pinning, loopback_server_group, pinned_to_one_cpu
from ..loadgen.client import (
    APPROXIMATE_WORDS,
    ClientConfig,
    LoadRun,
    Timeouts,
    run_load,
)
from ..loadgen.connections import connection_slots, make_http_client
from ..loadgen.progress import Progress, ProgressOutput, default_output
from ..loadgen.prompts import load_local_tokenizer, point_workload, render
from ..loadgen.selfcheck import point_verdict
from ..loadgen.tokenizer import count_tokens
from ..loadgen.workload import DEFAULT_STALL_TIMEOUT_S
from ..recipe.agentic import SCENARIO as AGENTIC_SCENARIO
from ..results.measurement import SIMULATED_NOTE, PointMeasurement
from .base import LoadSettings, ServerHandle
from .measured import measured_phase

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ..loadgen.prompts import RenderedWorkload, TextTokenizer
    from ..recipe.launch import ServerSpec
    from ..recipe.model import BenchPoint
    from ..results.metrics import RequestRecord
    from ..results.record import JSONValue



def _refused_continuous_usage(records: Sequence[RequestRecord]) -> bool:
    """Did every request fail with a 4xx about the stream options (a server without them)?"""
    return bool(records) and all(
        r.error.startswith("HTTP 4") and ("continuous_usage" in r.error
                                          or "stream_options" in r.error)
        for r in records)


def _prompt_token_check(workload: RenderedWorkload,
                        records: Sequence[RequestRecord]) -> dict[str, JSONValue]:
    """Does the server's usage.prompt_tokens confirm the workload's intended lengths?"""
    pairs = [(p.input_tokens, r.input_tokens)
             for p, r in zip(workload.prompts, records, strict=True) if r.success]
    return {
        "source": workload.token_source,
        "chat_template": workload.chat_template,
        "expected": sum(e for e, _ in pairs),
        "reported": sum(r for _, r in pairs),
        "mismatched_requests": sum(1 for e, r in pairs if e != r),
    }


class HttpServerHandle(ServerHandle):
    """A server with an OpenAI-compatible HTTP API at `base_url`."""

    base_url: str

    def __init__(self, *, base_url: str, spec: ServerSpec, simulated: bool = False,
                 time_scale: float | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.spec = spec
        self.simulated = simulated
        # What every point's record says about this server besides the client's own notes
        # (the simulated server's calibration).
        self.server_notes: tuple[str, ...] = ()
        # How far off a simulated server's point is expected to be, and the line that shows it
        # (`sim.point_expected_error`, asked with the server's engine config); None: no figure.
        self.expected_error: (
            Callable[[BenchPoint], tuple[Mapping[str, JSONValue], str]] | None) = None
        # The simulator's announced clock; 0: it streams on no clock at all.
        self.time_scale = time_scale
        # The leader of a local server's process group (process, sim-server), whose bound
        # CPUs the client keeps off; None where the server's processes are not known here.
        self.local_server_pid: int | None = None
        self._tokenizer: TextTokenizer | None = None
        self._tokenizer_looked_up = False

    def server_group(self) -> int | None:
        """The process group of the server's processes when they run on this host: the one
        this run started, else whoever listens on the loopback port of the URL (a server
        started by hand, a host-network container)."""
        if self.local_server_pid is not None:
            return self.local_server_pid
        return loopback_server_group(self.base_url)

    def stop(self) -> None:  # subclasses that own the server override this
        """Nothing to stop for a bare HTTP handle."""

    def tokenizer(self) -> TextTokenizer | None:
        """The served model's local tokenizer, looked up once per handle. A simulated server
        counts words (`loadgen/tokenizer.py`): the words scheme is its exact tokenizer."""
        if not self._tokenizer_looked_up:
            self._tokenizer = None if self.simulated else load_local_tokenizer(
                self.spec.tokenizer_source)
            self._tokenizer_looked_up = True
        return self._tokenizer

    def client_config(self, conc: int, tokenizer: TextTokenizer | None,
                      stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
                      point_timeout_s: float | None = None) -> ClientConfig:
        count: Callable[[str], int] = count_tokens
        if tokenizer is not None:
            tok = tokenizer

            def count(text: str) -> int:
                return len(tok.encode(text, add_special_tokens=False))

        return ClientConfig(
            base_url=self.base_url, model=self.spec.served_model,
            endpoint=self.spec.client.endpoint, concurrency=conc,
            timeouts=Timeouts(read_s=stall_timeout_s), point_deadline_s=point_timeout_s,
            api_key=os.environ.get("OPENAI_API_KEY") or None, count_text_tokens=count,
            # Words are the simulator's tokens exactly; for a real model they only approximate.
            text_token_source="tokenizer" if tokenizer is not None
            else "words" if self.simulated else APPROXIMATE_WORDS)

    def run_point(self, point: BenchPoint, load: LoadSettings,
                  progress: ProgressOutput | None = None) -> PointMeasurement:
        if point.server.scenario == AGENTIC_SCENARIO:
            from .http_replay import run_replay_point

            return run_replay_point(self, point, load)
        tokenizer = self.tokenizer()
        cfg = self.client_config(point.conc, tokenizer, load.stall_timeout_s,
                                 load.point_timeout_s)
        workload = render(point_workload(point.isl, point.osl, point.conc, load,
                                         self.spec.client, tokenizer, point.prompts), tokenizer)
        with pinned_to_one_cpu(self.server_group()) as pinning:
            return asyncio.run(self._measure(point, cfg, workload, pinning,
                                             progress or default_output()))

    async def _measure(self, point: BenchPoint, cfg: ClientConfig, workload: RenderedWorkload,
                       pinning: Pinning, output: ProgressOutput) -> PointMeasurement:
        notes: list[str] = []
        if self.simulated:
            notes.append(SIMULATED_NOTE)
        notes += self.server_notes
        async with make_http_client(cfg, 1) as client, connection_slots(cfg) as slots:
            warm = await run_load(slots, cfg, workload.warmup)
            if cfg.continuous_usage and _refused_continuous_usage(warm.records):
                cfg = dataclasses.replace(cfg, continuous_usage=False)
                notes.append("the server refused stream_options.continuous_usage_stats: tokens "
                             f"per chunk counted by {cfg.text_token_source}")
                warm = await run_load(slots, cfg, workload.warmup)
            warm_failed = sum(1 for r in warm.records if not r.success)
            if warm_failed:
                self.check_alive()
                notes.append(f"warmup: {warm_failed}/{len(warm.records)} requests failed")
            progress = Progress.to(output, f"{point.server.node_name} {point.name}",
                                   len(workload.prompts))

            async def load() -> LoadRun:
                progress.start()
                try:
                    return await run_load(slots, cfg, workload.prompts,
                                          send_offsets=workload.send_offsets,
                                          on_record=progress.on_record,
                                          on_read=progress.on_read if progress.enabled else None,
                                          chains=workload.workload.chains())
                finally:
                    await progress.stop()

            phase = await measured_phase(self, client, notes, load, point.server.gpus)
        run, stats, server = phase.run, phase.loop, phase.server_metrics
        check = point_verdict(stats, run.records, time_scale=self.time_scale)
        check["prompt_tokens"] = _prompt_token_check(workload, run.records)
        check["client_cpu_pinned"] = pinning.cpu
        check["client_cpu_choice"] = pinning.choice
        described = {**workload.workload.describe(), "token_source": workload.token_source,
                     "token_counts_estimated": cfg.text_token_source == APPROXIMATE_WORDS}
        expected, label = self.expected_error(point) if self.expected_error else ({}, None)
        return PointMeasurement(
            records=run.records, duration_s=run.duration_s, num_prompts=len(workload.prompts),
            max_concurrency=point.conc, simulated=self.simulated, server_metrics=server,
            client_check=check, notes=tuple(notes),
            started_unix=phase.started_unix, workload=described,
            time_scale=self.time_scale, power=phase.power, expected_error=expected,
            expected_error_label=label)
