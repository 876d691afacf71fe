"""The agentic aggregate as a pure function of records: warmup left out, the slow-tail
interactivity, 1 s completion windows, the first-start to last-end span per GPU, and the
validity reasons; each checked on requests whose numbers are known by construction."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pytest_inferbench.recipe.model import BenchPoint, Parallelism, ServerConfig
from pytest_inferbench.results.agentic import (
    FAILED_REQUEST_THRESHOLD,
    ReplayMeta,
    aggregate,
    inferencex_failures,
)
from pytest_inferbench.results.agentic_files import export_lines
from pytest_inferbench.results.build import build_result
from pytest_inferbench.results.measurement import PointMeasurement
from pytest_inferbench.results.metrics import RequestRecord

LONG = 1800.0  # a canonical replay duration (AIPerf's floor is 900 s)


def meta(num_gpus: int = 1, duration_s: float = LONG) -> ReplayMeta:
    return ReplayMeta(num_gpus=num_gpus, clock_start=0.0, start_unix=1_700_000_000.0,
                      duration_s=duration_s)


def request(send: float, ttft: float, itl: float, osl: int, *, isl: int = 100,
            end: float | None = None, warmup: bool = False, error: str = "") -> RequestRecord:
    """`osl` tokens, one a chunk: the first `ttft` after the send, the rest `itl` apart."""
    chunks = send + ttft + itl * np.arange(osl, dtype=np.float64)
    last = float(chunks[-1])
    return RequestRecord(send_time=send, end_time=last if end is None else end,
                         input_tokens=isl, output_tokens=osl, success=not error,
                         chunk_times=chunks if not error else np.zeros(0), error=error,
                         warmup=warmup)


def block(records: list[RequestRecord], m: ReplayMeta | None = None) -> dict[str, object]:
    return aggregate(records, m or meta())  # type: ignore[return-value]


def test_warmup_requests_change_no_metric_and_are_counted_as_dropped() -> None:
    measured = [request(float(i), 0.05, 0.01 * (i + 1), 20) for i in range(10)]
    # Warmups as AIPerf sends them: one output token, and far slower than the rest.
    warmups = [request(100.0 + i, 5.0, 1.0, 1, isl=9999, warmup=True) for i in range(4)]
    alone, mixed = block(measured), block(warmups + measured)
    assert mixed["request_metrics"] == alone["request_metrics"]
    accounting = mixed["request_accounting"]
    assert isinstance(accounting, dict)
    assert accounting["records_total"] == 14
    assert accounting["records_warmup_dropped"] == 4
    assert accounting["records_profiled"] == 10


def test_interactivity_is_one_over_the_p90_itl_not_the_p90_of_one_over_itl() -> None:
    itls = [0.001 * (i + 1) for i in range(10)]  # 1 .. 10 ms
    latency = block([request(0.0, 0.05, itl, 11) for itl in itls])["request_metrics"]
    assert isinstance(latency, dict)
    intvty = latency["latency"]["intvty"]
    # p90 of 1..10 ms with linear interpolation is 9.1 ms: the slow tail.
    assert intvty["p90"] == pytest.approx(1 / 0.0091)
    assert intvty["p90"] < float(np.percentile([1 / x for x in itls], 10)) + 1e-9
    assert latency["latency"]["tpot"] == latency["latency"]["itl"]


def test_e2e_normalized_interactivity_divides_the_latency_by_the_output_tokens() -> None:
    # Every request takes 1 s end to end; their outputs are 10, 20, ... 100 tokens.
    records = [request(0.0, 0.0 + 1.0 / n, (1.0 - 1.0 / n) / (n - 1), n)
               for n in range(10, 101, 10)]
    norm = block(records)["request_metrics"]["latency"]["e2e_norm_intvty"]  # type: ignore[index]
    per_token = [1.0 / n for n in range(10, 101, 10)]  # seconds per output token
    assert norm["p90"] == pytest.approx(1 / float(np.percentile(per_token, 90)))
    assert norm["mean"] == pytest.approx(1 / float(np.mean(per_token)))


def test_completions_are_counted_in_whole_one_second_windows() -> None:
    # Completions at 0.0, 0.5, 0.9 | 1.2 | 2.5 s: two whole windows before the last one.
    ends = [0.0, 0.5, 0.9, 1.2, 2.5]
    qps = block([request(0.0, e / 2 if e else 0.0, 0.0, 1, end=e) for e in ends])[
        "request_metrics"]["qps"]  # type: ignore[index]
    assert qps["samples"] == 2
    assert qps["window_seconds"] == 1.0
    assert qps["mean"] == pytest.approx(2.0)  # 3 and 1 completions
    assert qps["p50"] == pytest.approx(2.0)


def test_throughput_spans_the_first_start_to_the_last_end_per_gpu() -> None:
    records = [request(1.0, 0.1, 0.1, 10, isl=300, end=3.0),
               request(2.0, 0.1, 0.1, 30, isl=500, end=5.0)]
    throughput = block(records, meta(num_gpus=4))["request_metrics"]["throughput"]  # type: ignore[index]
    assert throughput["duration_seconds"] == pytest.approx(4.0)  # 1 s .. 5 s
    assert throughput["total"]["tokens_per_second"] == pytest.approx((800 + 40) / 4.0)
    assert throughput["per_gpu"]["output_tput_tps"] == pytest.approx(40 / 4.0 / 4)


def test_errors_are_left_out_of_the_metrics_and_counted_by_category() -> None:
    ok = [request(float(i), 0.05, 0.01, 20) for i in range(9)]
    failed = request(3.0, 0.05, 0.01, 20, error="HTTP 503: server busy")
    result = block([*ok, failed])
    assert result["request_metrics"] == block(ok)["request_metrics"]
    assert result["request_accounting"]["error_categories"] == {"HTTP 503": 1}  # type: ignore[index]


def test_a_long_clean_replay_is_a_valid_submission() -> None:
    valid = block([request(float(i), 0.05, 0.01, 20) for i in range(50)])["validity"]
    assert valid["submission_valid"] is True and valid["invalid_reasons"] == []  # type: ignore[index]


@pytest.mark.parametrize(("errors", "message", "reason"), [
    (2, "maximum context length is 4096 tokens", "context_overflow_rate_exceeded"),
    (11, "HTTP 500: boom", "run_cancelled"),
])
def test_aiperf_reasons_invalidate_a_submission(errors: int, message: str, reason: str) -> None:
    records = [request(float(i), 0.05, 0.01, 20, error=message if i < errors else "")
               for i in range(100)]
    valid = block(records)["validity"]
    assert valid["submission_valid"] is False  # type: ignore[index]
    assert [r.split(":")[0] for r in valid["invalid_reasons"]] == [reason]  # type: ignore[index]


def test_a_short_replay_or_missing_tokens_invalidate_a_submission() -> None:
    short = block([request(0.0, 0.05, 0.01, 20)], meta(duration_s=60.0))["validity"]
    assert [r.split(":")[0] for r in short["invalid_reasons"]] == ["unsafe_override"]  # type: ignore[index]
    # Successes that streamed no content chunk: no TTFT observed for them.
    empty = [RequestRecord(send_time=float(i), end_time=i + 1.0, input_tokens=10,
                           output_tokens=5, success=True) for i in range(3)]
    seen = [request(float(i), 0.05, 0.01, 20) for i in range(3)]
    valid = block([*seen, *empty])["validity"]
    assert any(str(r).startswith("insufficient_profile_metric_coverage")  # type: ignore[index]
               for r in valid["invalid_reasons"])


def test_inferencex_gate_fails_above_the_threshold_and_on_nothing_completed() -> None:
    def counts(errors: int, total: int) -> dict[str, object]:
        return {"completed": total, "errors": errors}

    at_limit = round(FAILED_REQUEST_THRESHOLD * 100)
    assert inferencex_failures(counts(at_limit, 100)) == []  # type: ignore[arg-type]
    assert inferencex_failures(counts(at_limit + 1, 100))  # type: ignore[arg-type]
    (zero,) = inferencex_failures(counts(0, 0))  # type: ignore[arg-type]
    assert "completed zero requests" in zero


def test_the_export_marks_warmups_and_masks_error_text() -> None:
    """profile_export.jsonl: every request, warmup included and marked as AIPerf marks it;
    a server's error text masked as every file of the plugin masks it."""
    records = [request(0.0, 0.05, 0.01, 20, warmup=True), request(1.0, 0.05, 0.01, 20),
               request(2.0, 0.05, 0.01, 20, error="HTTP 401: bad token sk-SECRET")]
    lines = [json.loads(line) for line in
             export_lines(records, meta(), lambda text: text.replace("sk-SECRET", "***"))]
    assert [x["metadata"]["benchmark_phase"] for x in lines] == ["warmup", "profiling",
                                                                 "profiling"]
    assert lines[2]["error"] == {"message": "HTTP 401: bad token ***"}
    assert lines[1]["metrics"]["output_sequence_length"]["value"] == 20


def agentic_point(tmp_path: Path) -> BenchPoint:
    server = ServerConfig(
        config_key="qwen3.5-fp8-b200-sglang-agentic", image="img", model="Qwen/Qwen3.5",
        model_prefix="qwen3.5", runner="cluster:b200", hardware="B200", precision="fp8",
        framework="sglang", multinode=False, disagg=False, parallel=Parallelism(tp=8),
        spec_decoding="none", sweeps=(), source=tmp_path / "nvidia-master.yaml", line=1,
        scenario="agentic-coding")
    return BenchPoint(server=server, isl=0, osl=0, conc=2, line=1)


def test_an_agentic_records_usual_metrics_leave_the_warmup_out(tmp_path: Path) -> None:
    """The point's record: its benchmark_serving keys count the profiled requests only, and
    its agentic numbers sit beside them."""
    point = agentic_point(tmp_path)
    server = point.server
    measured = [request(float(i), 0.05, 0.01, 20) for i in range(6)]
    warmups = [request(0.0, 2.0, 1.0, 1, warmup=True) for _ in range(3)]
    records = [*warmups, *measured]
    measurement = PointMeasurement(records=records, duration_s=10.0, num_prompts=len(records),
                                   max_concurrency=2, simulated=True,
                                   replay=meta(num_gpus=server.gpus))
    record = build_result(point, measurement, spec=None, backend="sim-server")
    assert record["num_prompts"] == record["completed"] == len(measured)
    assert record["median_ttft"] == pytest.approx(0.05)  # the warmups' 2 s left out
    block = record["agentic"]
    assert isinstance(block, dict)
    assert block["request_accounting"]["records_warmup_dropped"] == len(warmups)
    per_gpu = block["request_metrics"]["throughput"]["per_gpu"]["total_tput_tps"]
    assert record["agentic_tput_per_gpu"] == per_gpu


def test_a_replay_that_only_says_it_is_one_is_aggregated_on_its_own_clock(
        tmp_path: Path) -> None:
    """A backend's replay that hands over records and its workload kind, not the replay's
    metadata (the in-process replay may): the record still gets the agentic numbers."""
    records = [request(float(i), 0.05, 0.01, 20) for i in range(6)]
    measurement = PointMeasurement(records=records, duration_s=10.0, num_prompts=6,
                                   max_concurrency=2, simulated=True, started_unix=1e9,
                                   workload={"kind": "agentic-replay", "duration_s": 10.0})
    record = build_result(agentic_point(tmp_path), measurement, spec=None, backend="sim")
    with_meta = block(records, meta(num_gpus=8, duration_s=10.0))
    assert record["agentic"]["request_metrics"] == with_meta["request_metrics"]  # type: ignore[index]
    assert record["agentic"]["validity"]["invalid_reasons"] == [  # type: ignore[index]
        "unsafe_override: benchmark duration 10 s < 900 s"]
