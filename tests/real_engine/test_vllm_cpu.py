"""vLLM's CPU build, started, measured, evaluated and stopped by the plugin.

The compared point (the plain node's conc-4 point) is measured three times beside a CPU-busy
process of another session: through the external backend against a vLLM this test starts,
then through the process backend (the project's whole recipe: the plain node's points and its
GSM8K item, then the ngram node's point), then through the external backend again. The two
external points bracket the process point, so a load that drifts steadily across them (the host is
shared) moves the bracket, not the comparison. One more process-backend run has its server
stopped (SIGSTOP) in one point and killed in the next. Four server starts in all.

Where everything runs is set, not left to the scheduler: the launch spec binds the server to
CPU 0 (`cpu_project.SERVER_CPU`), the client keeps off the server's bound CPUs (CPU 1, stated
in each point's client check), the busy neighbour runs on the server's CPU. Every comparison
reads the server's histograms over the point's own measured phase (the point's record).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from cpu_watch import CpuWatch
from vllm_helpers import (
    REPO,
    SERVER_CPU,
    CpuProject,
    PluginRun,
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

pytestmark = pytest.mark.real_engine

# The plain node's concurrency-4 point is the one both backends measure.
COMPARED = "conc4"
# Long enough to be steady at a few hundred tok/s and up: 100 requests of 32 tokens at conc 4.
PROMPTS_PER_CONC = "25"
MODEL_SCRIPT = REPO / "benchmarks" / "real_engine" / "make_tiny_llama.py"
# Short stalls, and points long enough (10 requests) for the test to stop the server in one.
STALL_TIMEOUT_S = 3.0
STALL_PROMPTS = 10


@dataclass(frozen=True)
class ExternalVllm:
    proc: subprocess.Popen[bytes]
    base_url: str
    log: Path


@pytest.fixture(scope="module")
def cpu_watch() -> Iterator[CpuWatch]:
    watch = CpuWatch()
    yield watch
    watch.stop()


def cpu_use(watch: CpuWatch, raw: dict[str, Any]) -> str:
    """Who used the CPUs over the point's measured phase."""
    return watch.report(raw["benchmark_start_time_unix"], raw["benchmark_end_time_unix"])


@pytest.fixture(scope="module")
def external_server(cpu_project: CpuProject, busy_neighbour: int, cpu_watch: CpuWatch,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExternalVllm]:
    """A vLLM started here as a user starts it from a shell, kept for both external points."""
    log = tmp_path_factory.mktemp("external") / "vllm.log"
    proc, server = start_vllm(cpu_project, log)
    try:
        # A new server's first requests pay one-time costs: before any measured point.
        for _ in range(4):
            httpx.post(f"{server.base_url}/v1/completions", timeout=120.0, trust_env=False,
                       json={"model": cpu_project.served_model, "prompt": "warm up " * 64,
                             "max_tokens": 32, "ignore_eos": True})
        yield ExternalVllm(proc, server.base_url, log)
    finally:
        stop_group(proc)


def external_point(project: CpuProject, server: ExternalVllm, results: Path) -> PluginRun:
    return run_plugin(project, results, "--inferbench-backend=external",
                      f"--inferbench-base-url={server.base_url}", "-m", "not eval",
                      f"--inferbench-prompts-per-conc={PROMPTS_PER_CONC}",
                      "-k", f"not mtp and {COMPARED}")


@pytest.fixture(scope="module")
def external_before(cpu_project: CpuProject, external_server: ExternalVllm,
                    tmp_path_factory: pytest.TempPathFactory) -> PluginRun:
    return external_point(cpu_project, external_server, tmp_path_factory.mktemp("ext-before"))


@pytest.fixture(scope="module")
def process_run(cpu_project: CpuProject, busy_neighbour: int, external_before: PluginRun,
                tmp_path_factory: pytest.TempPathFactory) -> PluginRun:
    return run_plugin(cpu_project, tmp_path_factory.mktemp("process-results"),
                      "--inferbench-backend=process", "--inferbench-eval-data=data/test.jsonl",
                      "--inferbench-eval-limit=1", "-k", "not (mtp and eval)",
                      f"--inferbench-prompts-per-conc={PROMPTS_PER_CONC}")


@pytest.fixture(scope="module")
def external_after(cpu_project: CpuProject, external_server: ExternalVllm,
                   process_run: PluginRun, tmp_path_factory: pytest.TempPathFactory
                   ) -> PluginRun:
    return external_point(cpu_project, external_server, tmp_path_factory.mktemp("ext-after"))


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split(maxsplit=1)[0]


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


def verdict(raw: dict[str, Any]) -> str:
    """The point's client self-check in a few words: whether the client says it distorted the
    timings (a host so loaded that the client's event loop stalls), and the load average now."""
    check = raw["inferbench"]["client_check"]
    return (f"client self-check {'ok' if check['ok'] else 'failed'}, stalled "
            f"{check['stalled_share']:.0%} (load average {load_average()})")


def test_process_and_external_agree_under_a_busy_neighbour(
        process_run: PluginRun, external_before: PluginRun, external_after: PluginRun,
        cpu_watch: CpuWatch) -> None:
    """The process point against the mean of the external points around it, within 10%. The
    message has vLLM's own median TPOT of each point: a server that ran slower in one of them
    (the host's load moved) shows there as well as in the client's numbers."""
    ours: dict[str, Any] = process_run.points()[COMPARED]
    brackets: list[dict[str, Any]] = [run.points()[COMPARED]
                                      for run in (external_before, external_after)]
    for raw in (ours, *brackets):
        check = raw["inferbench"]["client_check"]
        assert check["client_cpu_pinned"] not in (None, SERVER_CPU), check
        assert f"off the local server's bound CPUs [{SERVER_CPU}]" in check["client_cpu_choice"]
    server_tpot = [1e3 * raw["inferbench"]["server_metrics"]["latency_histograms"]["tpot"][
        "median_s"] for raw in (ours, *brackets)]
    report = [f"vLLM's median TPOT: process {server_tpot[0]:.3f} ms, external "
              f"{server_tpot[1]:.3f} / {server_tpot[2]:.3f}"]
    for key in ("output_throughput", "median_tpot_ms"):
        values = [raw[key] for raw in brackets]
        report.append(f"{key}: process {ours[key]:.4g}, external {values[0]:.4g} / "
                      f"{values[1]:.4g}, ratio {ours[key] / (sum(values) / 2):.3f}")
    report += [f"{name}: {verdict(raw)}; {cpu_use(cpu_watch, raw)}"
               for name, raw in zip(("process", "external before", "external after"),
                                    (ours, *brackets), strict=True)]
    print("; ".join(report))
    for key in ("output_throughput", "median_tpot_ms"):
        theirs = sum(raw[key] for raw in brackets) / 2
        assert ours[key] == pytest.approx(theirs, rel=0.10), report


@pytest.mark.parametrize("which", ["process", "external-before", "external-after"])
def test_plugin_tpot_matches_vllm_histograms_over_the_point(
        which: str, process_run: PluginRun, external_before: PluginRun,
        external_after: PluginRun) -> None:
    """The client's TPOT against vLLM's own, over the same measured phase (the histograms'
    bucket deltas the point records). vLLM's per-request TPOT histogram (it shares the ITL
    histogram's buckets, 2% apart in the launch spec, so its median is known to 2%) holds the
    client's statistic: the median TPOT within 5% of its median. Its inter-token histogram's
    exact mean (sum / count) against the client's mean ITL, within 5%. (Not the ITL median: a
    median over gaps is not the median of per-request means; 2.4 vs 3.0 ms here.)"""
    run = {"process": process_run, "external-before": external_before,
           "external-after": external_after}[which]
    raw: dict[str, Any] = run.points()[COMPARED]
    latency = raw["inferbench"]["server_metrics"]["latency_histograms"]
    tpot, itl = latency["tpot"], latency["itl"]
    assert tpot["count"] == raw["completed"], run.output  # the measured requests, no warmup
    server_tpot_ms, server_itl_ms = 1e3 * tpot["median_s"], 1e3 * itl["mean_s"]
    said = (f"{which}: median TPOT {raw['median_tpot_ms']:.3f} ms vs vLLM's {server_tpot_ms:.3f}"
            f" ({raw['median_tpot_ms'] / server_tpot_ms:.3f}); mean ITL {raw['mean_itl_ms']:.3f}"
            f" vs {server_itl_ms:.3f} ({raw['mean_itl_ms'] / server_itl_ms:.3f}); {verdict(raw)}")
    print(said)
    assert raw["median_tpot_ms"] == pytest.approx(server_tpot_ms, rel=0.05), said
    assert raw["mean_itl_ms"] == pytest.approx(server_itl_ms, rel=0.05), said


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
