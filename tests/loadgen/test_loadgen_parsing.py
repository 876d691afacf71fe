"""SSE parsing, Prometheus deltas and the self-check verdict, on real inputs.

The stream bytes are what an OpenAI-compatible server writes; the Prometheus text is produced
by `prometheus_client` itself, as the servers do.
"""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from pytest_inferbench.loadgen import selfcheck
from pytest_inferbench.loadgen.client import ClientConfig, _record
from pytest_inferbench.loadgen.prompts import Prompt
from pytest_inferbench.loadgen.scrape import Snapshot, parse_metrics, point_metrics
from pytest_inferbench.loadgen.selfcheck import LoopMonitor, LoopStats, verdict
from pytest_inferbench.loadgen.sse import parse_stream

CFG = ClientConfig(base_url="http://127.0.0.1:1", model="m")


def event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(text: str, completion: int | None = None, finish: str | None = None) -> bytes:
    obj: dict[str, object] = {"id": "cmpl-1", "choices": [
        {"index": 0, "text": text, "finish_reason": finish}]}
    if completion is not None:
        obj["usage"] = {"prompt_tokens": 7, "completion_tokens": completion}
    return event(obj)


def test_events_split_across_reads_get_the_time_of_the_completing_read() -> None:
    first, second = chunk(" a b"), chunk(" c")
    reads = [(1.0, first[:10]), (2.0, first[10:] + second[:5]), (3.0, second[5:]),
             (4.0, event({"id": "cmpl-1", "choices": [], "usage": {
                 "prompt_tokens": 7, "completion_tokens": 3}}) + b"data: [DONE]\n\n")]
    parsed = parse_stream(reads, CFG)
    assert parsed.chunk_times == [2.0, 3.0]
    assert parsed.chunk_tokens == [2, 1]  # counted from the text: two words, then one
    assert parsed.done
    assert parsed.completion_tokens == 3
    assert parsed.prompt_tokens == 7
    assert parsed.response_id == "cmpl-1"


def test_continuous_usage_gives_tokens_per_chunk() -> None:
    # Text that would count differently: the usage deltas win.
    reads = [(1.0, chunk("x", completion=1)), (1.5, chunk("yz", completion=4)),
             (2.0, chunk("", completion=4, finish="length") + b"data: [DONE]\r\n\r\n")]
    parsed = parse_stream(reads, CFG)
    assert parsed.chunk_tokens == [1, 3]
    assert parsed.all_from_usage
    assert parsed.finish_reason == "length"
    assert parsed.done


def test_chat_deltas_skip_the_role_only_chunk() -> None:
    chat = ClientConfig(base_url="http://x", model="m", endpoint="/v1/chat/completions")
    role = event({"id": "c", "choices": [{"delta": {"role": "assistant", "content": ""}}]})
    text = event({"id": "c", "choices": [{"delta": {"content": " hi there"}}]})
    parsed = parse_stream([(1.0, role), (2.0, text + b"data: [DONE]\n\n")], chat)
    assert parsed.chunk_times == [2.0]
    assert parsed.chunk_tokens == [2]


def prompt(out: int = 2) -> Prompt:
    return Prompt(text="a b c", input_tokens=3, output_tokens=out)


@pytest.mark.parametrize(("reads", "reason"), [
    ([(1.0, chunk(" a")), (2.0, chunk(" b"))], "stream ended without [DONE]"),
    ([(1.0, b"data: [DONE]\n\n")], "no token received"),
    ([(1.0, chunk(" a")), (1.1, event({"error": {"message": "engine died"}}))],
     "error in stream: engine died"),
    ([(1.0, chunk(" a", completion=1)), (1.1, b"data: [DONE]\n\n")],
     "output stopped early under ignore_eos (finish_reason=None)"),
])
def test_truncated_and_broken_streams_are_failures_with_reasons(
        reads: list[tuple[float, bytes]], reason: str) -> None:
    record = _record(prompt(), CFG, 0.5, 3.0, reads, "", None)
    assert not record.success
    assert record.error == reason


def test_a_complete_stream_is_a_success() -> None:
    reads = [(1.0, chunk(" a", completion=1)), (1.2, chunk(" b", completion=2)),
             (1.3, b"data: [DONE]\n\n")]
    record = _record(prompt(), CFG, 0.5, 1.4, reads, "", None)
    assert record.success, record.error
    assert record.output_tokens == 2
    assert record.input_tokens == 7  # the server's usage.prompt_tokens, not the intended 3
    assert record.token_source == "usage"
    assert list(record.chunk_times) == [1.0, 1.2]


def registry_text(drafts: float, accepted: float, draft_tokens: float, kv: float) -> str:
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    c_drafts = Counter("vllm:spec_decode_num_drafts", "drafts", labels, registry=registry)
    c_acc = Counter("vllm:spec_decode_num_accepted_tokens", "acc", labels, registry=registry)
    c_dt = Counter("vllm:spec_decode_num_draft_tokens", "dt", labels, registry=registry)
    gauge = Gauge("vllm:kv_cache_usage_perc", "kv", registry=registry)
    # Two engines (label sets): the counters are summed over them.
    for engine, share in (("0", 0.25), ("1", 0.75)):
        c_drafts.labels("m", engine).inc(drafts * share)
        c_acc.labels("m", engine).inc(accepted * share)
        c_dt.labels("m", engine).inc(draft_tokens * share)
    gauge.set(kv)
    return generate_latest(registry).decode()


def test_acceptance_length_from_vllm_counter_deltas() -> None:
    before = Snapshot(*parse_metrics(registry_text(100, 150, 300, 0.1)))
    after = Snapshot(*parse_metrics(registry_text(1100, 2150, 3300, 0.4)))
    out = point_metrics(before, after)
    assert out["acceptance_length"] == pytest.approx(1 + 2000 / 1000)
    assert out["acceptance_length_source"] == "vllm:spec_decode_*"
    assert out["acceptance_rate"] == pytest.approx(2000 / 3000)
    # The gauge as read after the point is kept as read; KV usage is what was sampled during
    # the point (none here), not this.
    assert out["gauges"]["vllm:kv_cache_usage_perc"] == pytest.approx(0.4)
    assert not any(key.startswith("kv_cache_usage") for key in out)
    assert out["counter_deltas"]["vllm:spec_decode_num_drafts_total"] == pytest.approx(1000)


def test_acceptance_length_from_atom_mtp_stats() -> None:
    before = Snapshot(mtp_stats={"enabled": True, "total_accepted_tokens": 10,
                                 "distribution": {"0": 5, "3": 5}})
    after = Snapshot(mtp_stats={"enabled": True, "total_accepted_tokens": 10 + 3 * 60 + 20,
                                "distribution": {"0": 25, "3": 65}})
    out = point_metrics(before, after)
    assert out["acceptance_length"] == pytest.approx(1 + 200 / 80)
    assert out["acceptance_length_source"] == "/debug/mtp_stats"


def test_no_speculation_means_no_acceptance_length() -> None:
    registry = CollectorRegistry()
    Counter("vllm:num_preemptions", "p", registry=registry).inc(3)
    text = generate_latest(registry).decode()
    out = point_metrics(Snapshot(), Snapshot(*parse_metrics(text)))
    assert "acceptance_length" not in out
    assert out["preemptions"] == 3


def test_event_loop_lag_fails_the_self_check() -> None:
    hogs: list[float] = []

    async def blocked() -> dict[str, object]:
        monitor = LoopMonitor(interval_s=0.002)
        origin = time.perf_counter()
        monitor.start()
        for _ in range(5):
            await asyncio.sleep(0.01)
            hogs.append(time.perf_counter() - origin)
            time.sleep(0.03)  # the client hogging its own loop, as heavy parsing would
        await asyncio.sleep(0.01)  # the ticker's wake-up after the last hog
        stats = await monitor.stop()
        return verdict(stats, median_itl_s=0.02, median_ttft_s=0.2, origin_s=origin)

    check = asyncio.run(blocked())
    assert check["ok"] is False
    assert check["lag_max_ms"] >= 25
    assert "event-loop lag" in str(check["reason"])
    # Each hog is listed as a stall that began when the ticker was due inside it, or just
    # before (the ticker was due no later than one interval after its last wake-up).
    stalls = check["stalls"]
    assert isinstance(stalls, list)
    for hog in hogs:
        assert any(start <= hog + 0.03 and start + lag / 1000 >= hog + 0.025
                   for start, lag in stalls), (hog, stalls)


def test_lag_before_the_measured_phase_is_not_judged() -> None:
    """A stall that ended before the first measured send (the loop parsing the server's
    /metrics before the phase) delayed no measured timestamp; of one that spans the first send
    only the part after it counts; the same stall inside the phase fails the point."""
    interval = 0.002
    due = 100.0 + interval * np.arange(500)  # 1 s of ticks from t = 100 s
    lag = np.full(due.size, 0.0002)
    lag[10] = 0.040  # due at 100.020 s, woke at 100.060 s
    stats = LoopStats(lag_s=lag, cpu_s=0.1, wall_s=1.0, due_s=due)
    medians = {"median_itl_s": 0.002, "median_ttft_s": 0.01, "median_e2el_s": 0.039}
    before = verdict(stats, **medians, origin_s=100.061)
    assert before["ok"] is True, before["reason"]
    assert before["lag_max_ms"] < 1 and before["stalls"] == []
    assert before["wall_s"] == pytest.approx(1.0 - 0.061)
    spanning = verdict(stats, **medians, origin_s=100.050)  # 10 ms of it after the first send
    assert spanning["lag_max_ms"] == pytest.approx(10.0)
    assert spanning["stalls"] == [[pytest.approx(0.0), pytest.approx(10.0)]]
    inside = verdict(stats, **medians, origin_s=100.001)
    assert inside["ok"] is False
    assert "longest event-loop stall 40 ms" in str(inside["reason"]), inside["reason"]


def test_idle_loop_passes_against_a_generous_interval() -> None:
    async def idle() -> dict[str, object]:
        monitor = LoopMonitor(interval_s=0.002)
        monitor.start()
        await asyncio.sleep(0.1)
        return verdict(await monitor.stop(), median_itl_s=0.0, median_ttft_s=1.0)

    check = asyncio.run(idle())
    assert check["lag_samples"] > 0
    # The lag limits scale with the interval measured: 25% (p90) and 100% (p99) of the 1 s
    # TTFT, which only a badly stalled loop would miss. (Whether the loop stalled for more than
    # a share of this short window is the machine's load, judged by the stall tests.)
    reason = str(check["reason"])
    assert "lag p90" not in reason and "lag p99" not in reason, reason
    assert check["lag_p90_ms"] < selfcheck.MAX_TYPICAL_LAG_FRACTION * 1000
    assert check["lag_p99_ms"] < selfcheck.MAX_TAIL_LAG_FRACTION * 1000


def test_progress_line_redraws_and_clears() -> None:
    import io

    from pytest_inferbench.loadgen.progress import Progress
    from pytest_inferbench.results.metrics import RequestRecord

    out = io.StringIO()

    async def run() -> None:
        progress = Progress("node isl8-osl8-conc2", 3, out, refresh_s=0.01)
        progress.start()
        progress.on_record(RequestRecord(0.0, 1.0, 8, 8, True))
        progress.on_record(RequestRecord(0.0, 1.0, 8, 0, False, error="x"))
        await asyncio.sleep(0.05)
        await progress.stop()

    asyncio.run(run())
    text = out.getvalue()
    assert "node isl8-osl8-conc2: 2/3 requests, 1 failed" in text
    assert "output tok/s" in text
    assert text.endswith("\x1b7\x1b[K\x1b8")  # wiped when the point ends, cursor kept


def test_progress_is_quiet_without_a_terminal() -> None:
    from pytest_inferbench.loadgen.progress import Progress

    async def run() -> bool:
        progress = Progress("x", 1, None)
        progress.start()
        await progress.stop()
        return progress.enabled

    assert asyncio.run(run()) is False


def test_pinning_restores_the_affinity() -> None:
    import os

    from pytest_inferbench.loadgen.affinity import pinned_to_one_cpu

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    before = os.sched_getaffinity(0)
    with pinned_to_one_cpu() as pinning:
        inside = os.sched_getaffinity(0)
    cpu = pinning.cpu
    assert os.sched_getaffinity(0) == before
    if len(before) > 1:
        assert cpu in before and inside == {cpu}
    else:
        assert cpu is None and inside == before


def test_xdist_workers_take_different_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_inferbench.loadgen.affinity import chosen_cpu

    picks = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        picks.append(chosen_cpu({4, 7}))
    assert picks == [4, 7, 4]
