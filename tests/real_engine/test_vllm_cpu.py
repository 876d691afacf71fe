"""vLLM's CPU build, started, measured, evaluated and stopped by the plugin.

One process-backend run of the project's recipe (the plain node's points and its GSM8K item,
then the ngram node's point) and one external-backend run of the same plain point against a
vLLM this test starts, both while a CPU-busy process of another session runs; one more
process-backend run in which the server is stopped (SIGSTOP) in one point and killed in the
next. Four server starts in all.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import pytest
from vllm_helpers import (
    REPO,
    CpuProject,
    PluginRun,
    histogram_buckets,
    run_plugin,
    scrape,
    start_vllm,
    stop_group,
    vllm_server_under,
    vllm_servers_on,
)

from pytest_inferbench.backends.supervised import SETTLE_S
from pytest_inferbench.loadgen.scrape import SCRAPE_TIMEOUT_S

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.real_engine

# The plain node's concurrency-4 point is the one both backends measure.
COMPARED = "conc4"
MODEL_SCRIPT = REPO / "benchmarks" / "real_engine" / "make_tiny_llama.py"
# Short stalls, and points long enough (10 requests) for the test to stop the server in one.
STALL_TIMEOUT_S = 3.0
STALL_PROMPTS = 10
ITL = "vllm:inter_token_latency_seconds"


@pytest.fixture(scope="module")
def process_run(cpu_project: CpuProject, busy_neighbour: int,
                tmp_path_factory: pytest.TempPathFactory) -> PluginRun:
    return run_plugin(cpu_project, tmp_path_factory.mktemp("process-results"),
                      "--inferbench-backend=process", "--inferbench-eval-data=data/test.jsonl",
                      "--inferbench-eval-limit=1", "-k", "not (mtp and eval)")


@dataclass(frozen=True)
class ExternalRun:
    run: PluginRun
    before: dict[str, float]
    after: dict[str, float]
    buckets_before: dict[float, float]
    buckets_after: dict[float, float]


@pytest.fixture(scope="module")
def external_run(cpu_project: CpuProject, busy_neighbour: int,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExternalRun]:
    """The plain conc-4 point against a vLLM started here, and the server's metrics around it."""
    log = tmp_path_factory.mktemp("external") / "vllm.log"
    proc, server = start_vllm(cpu_project, log)
    try:
        # A new server's first requests pay one-time costs in its intervals: they come before
        # the histogram's baseline, as the plugin's warmup comes before its own scrape.
        for _ in range(4):
            httpx.post(f"{server.base_url}/v1/completions", timeout=120.0, trust_env=False,
                       json={"model": cpu_project.served_model, "prompt": "warm up " * 64,
                             "max_tokens": 32, "ignore_eos": True})
        before = scrape(server.base_url)
        buckets_before = histogram_buckets(server.base_url, ITL)
        run = run_plugin(cpu_project, log.parent / "results", "--inferbench-backend=external",
                         f"--inferbench-base-url={server.base_url}", "-m", "not eval",
                         "-k", f"not mtp and {COMPARED}")
        yield ExternalRun(run, before, scrape(server.base_url), buckets_before,
                          histogram_buckets(server.base_url, ITL))
    finally:
        stop_group(proc)


def test_process_backend_starts_measures_and_stops_vllm(process_run: PluginRun) -> None:
    text = process_run.output
    points = process_run.points()
    assert set(points) == {"conc1", "conc4", "mtp-conc4"}, text
    for name, raw in points.items():
        info = raw["inferbench"]
        assert info["simulated"] is False and info["hardware"] == "CPU", name
        assert raw["completed"] == raw["num_prompts"] > 0, (name, text)
        # vLLM counts every streamed token (continuous usage): output tokens are the server's.
        assert info["chunk_token_source"] == "usage", name
        assert raw["total_output_tokens"] == info["server_metrics"]["counter_deltas"][
            "vllm:generation_tokens_total"], name
    for node in ("isl128-osl32-conc1", "isl128-osl32-conc4"):
        assert f"PASSED cpu-master.yaml::tinyllama-bf16-cpu-vllm-tp1::{node}" in text, text
    assert "PASSED cpu-master.yaml::tinyllama-bf16-cpu-vllm-tp1-mtp::isl128-osl32-conc4" in text
    # The plugin stopped what it started: no vLLM serves the ports its servers' logs name.
    logs = sorted((process_run.results / "server-logs").glob("*.log"))
    ports = [int(port) for log in logs
             for port in re.findall(r"Starting vLLM server on http://[^:]+:(\d+)", log.read_text())]
    assert len(ports) == 2, [log.name for log in logs]
    assert not [pid for port in ports for pid in vllm_servers_on(port)]


def test_gsm8k_item_runs_and_random_weights_fail_the_threshold(process_run: PluginRun) -> None:
    """The eval item runs against the real server; a model of random weights answers nonsense,
    so its score is below InferenceX's 0.9 and the item fails saying so (expected)."""
    text = process_run.output
    assert "FAILED cpu-master.yaml::tinyllama-bf16-cpu-vllm-tp1::eval-gsm8k" in text, text
    failure = text.split("_ tinyllama-bf16-cpu-vllm-tp1::eval-gsm8k _", 1)[1]
    assert "gsm8k exact_match,strict-match = " in failure, text
    assert "< 0.9 (default in " in failure, text


def test_ngram_points_record_their_kind_and_vllm_acceptance(process_run: PluginRun) -> None:
    raw = process_run.points()["mtp-conc4"]
    info = raw["inferbench"]
    assert info["spec_method"] == "ngram"
    deltas = info["server_metrics"]["counter_deltas"]
    drafts = deltas["vllm:spec_decode_num_drafts_total"]
    accepted = deltas["vllm:spec_decode_num_accepted_tokens_total"]
    assert drafts > 0
    assert info["acceptance_length"] == pytest.approx(1.0 + accepted / drafts, rel=1e-9)


def test_process_and_external_agree_under_a_busy_neighbour(
        process_run: PluginRun, external_run: ExternalRun) -> None:
    ours, theirs = process_run.points()[COMPARED], external_run.run.points()[COMPARED]
    for key in ("output_throughput", "median_tpot_ms"):
        assert theirs[key] == pytest.approx(ours[key], rel=0.10), (key, ours[key], theirs[key])


def test_plugin_tpot_matches_vllm_itl_histogram(external_run: ExternalRun) -> None:
    """The client's intervals against vLLM's own inter-token histogram over the same requests
    (the point and its warmup). The histogram's buckets (10 ms, 25 ms, ...) are far coarser than
    a CPU's few-ms intervals, so: the means (the histogram's sum / count) agree within 5%, and
    the client's median interval lies in the bucket that holds the server's median interval.
    (The median TPOT, a per-request mean, is a statistic no histogram of vLLM's holds.)"""
    run, before, after = external_run.run, external_run.before, external_run.after
    raw = run.points()[COMPARED]
    server_mean_ms = 1e3 * ((after[f"{ITL}_sum"] - before[f"{ITL}_sum"])
                            / (after[f"{ITL}_count"] - before[f"{ITL}_count"]))
    assert raw["mean_itl_ms"] == pytest.approx(server_mean_ms, rel=0.05), run.output
    counts = {bound: external_run.buckets_after[bound] - external_run.buckets_before.get(bound, 0)
              for bound in sorted(external_run.buckets_after)}
    total = counts[max(counts)]
    bounds = sorted(counts)
    upper = next(bound for bound in bounds if counts[bound] >= total / 2)
    lower = max((bound for bound in bounds if bound < upper), default=0.0)
    assert lower <= raw["median_itl_ms"] / 1e3 <= upper, (lower, upper, raw["median_itl_ms"])


def test_stalled_then_crashed_server_fail_their_points_with_vllm_log(
        cpu_project: CpuProject, tmp_path: Path) -> None:
    """SIGSTOP during the conc-1 point: it fails by the stall timeout, in bounded time; the
    server is resumed, then killed during the conc-4 point, which fails with vLLM's log tail."""
    events: dict[str, float] = {}
    results = tmp_path / "results"

    def inject(pytest_pid: int, output: Path) -> None:
        def act() -> None:
            found = wait_for(lambda: running_server(pytest_pid), 900)
            assert isinstance(found, tuple)
            pid = found[0]
            os.kill(pid, signal.SIGSTOP)
            events["stopped"] = time.monotonic()
            # pytest's verbose line of the point's end (the server stays stopped until then).
            wait_for(lambda: re.search(r"isl128-osl32-conc1 FAILED", output.read_text()), 600)
            events["first_point_done"] = time.monotonic()
            os.kill(pid, signal.SIGCONT)
            wait_for(lambda: running_server(pytest_pid), 600)
            os.kill(pid, signal.SIGKILL)
            events["killed"] = time.monotonic()

        threading.Thread(target=act, daemon=True).start()

    run = run_plugin(cpu_project, results, "--inferbench-backend=process", "-m", "not eval", "-v",
                     "-k", "not mtp", f"--inferbench-stall-timeout={STALL_TIMEOUT_S}",
                     f"--inferbench-prompts-per-conc={STALL_PROMPTS}",
                     during=inject)
    text = run.output
    assert {"stopped", "first_point_done", "killed"} <= set(events), text
    assert "FAILED cpu-master.yaml::tinyllama-bf16-cpu-vllm-tp1::isl128-osl32-conc1" in text
    # Bounded, not a hang: one after the other, each of its requests (2 warmups and the
    # prompts) waits one stall timeout at most, the /metrics scrape after the load its own
    # timeout, then the health check's settle wait (and a margin for a busy host).
    bound = (2 + STALL_PROMPTS) * STALL_TIMEOUT_S + SCRAPE_TIMEOUT_S + SETTLE_S + 30.0
    assert events["first_point_done"] - events["stopped"] < bound, text
    stall = text.split("isl128-osl32-conc1", 1)[1]
    assert "still runs but did not answer" in stall and "--- last log lines ---" in stall, text
    assert "FAILED cpu-master.yaml::tinyllama-bf16-cpu-vllm-tp1::isl128-osl32-conc4" in text
    crash = text.split("isl128-osl32-conc4", 1)[1]
    assert "exited with code" in crash and "--- last log lines ---" in crash, text
    assert "vLLM" in crash or "APIServer" in crash, text


def running_server(pytest_pid: int) -> tuple[int, int] | None:
    """The vLLM under the run once it has a request running, else None."""
    found = vllm_server_under(pytest_pid)
    if found is None:
        return None
    try:
        metrics = scrape(f"http://127.0.0.1:{found[1]}")
    except Exception:  # not up yet
        return None
    return found if metrics.get("vllm:num_requests_running", 0.0) > 0 else None


def wait_for(check: object, timeout_s: float) -> object:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError


def test_the_model_script_makes_the_same_model_twice(cpu_project: CpuProject,
                                                     tmp_path: Path) -> None:
    """Seeded weights and a tokenizer trained on fixed text: a second make is byte for byte
    the model the tier serves (no download, nothing of the machine in it)."""
    again = tmp_path / "model"
    subprocess.run([str(cpu_project.python), str(MODEL_SCRIPT), str(again)], check=True,
                   capture_output=True)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (cpu_project.model / name).read_bytes(), name
