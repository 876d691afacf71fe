"""The metric formulas against records whose numbers are worked out by hand.

Expected values are derived here from the definitions (stdlib `statistics`, plain arithmetic),
independently of numpy, so the test checks the formulas rather than restating the code.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from pytest_inferbench.results.metric_kinds import percentile_label
from pytest_inferbench.results.metrics import NO_CHUNK_ERROR, RequestRecord, summarize


def record(send: float, chunks: list[float], tokens: list[int], *, out: int | None = None,
           inp: int = 10) -> RequestRecord:
    return RequestRecord(
        send_time=send, end_time=chunks[-1] + 0.001, input_tokens=inp,
        output_tokens=sum(tokens) if out is None else out, success=True,
        chunk_times=np.array(chunks, dtype=np.float64),
        chunk_tokens=np.array(tokens, dtype=np.int64))


def failure(error: str) -> RequestRecord:
    return RequestRecord(send_time=0.0, end_time=0.1, input_tokens=10, output_tokens=0,
                         success=False, error=error)


# A: three chunks, the middle one carries two tokens (a speculative step).
REC_A = record(0.0, [0.1, 0.3, 0.4], [1, 2, 1], inp=10)
# B: a single-token output: TPOT is undefined for it.
REC_B = record(1.0, [1.2], [1], inp=20)
# C: one token per chunk.
REC_C = record(0.5, [0.55, 0.65, 0.95], [1, 1, 1], inp=30)
NO_CHUNK = RequestRecord(send_time=0.0, end_time=0.2, input_tokens=10, output_tokens=0,
                         success=True)

TTFT = [0.1, 0.2, 0.05]
E2EL = [0.4, 0.2, 0.45]
TPOT = [(0.4 - 0.1) / 3, (0.45 - 0.05) / 2]  # B has one output token and no TPOT
CHUNK_ITL = [0.2, 0.1, 0.1, 0.3]
TOKEN_ITL = [0.1, 0.1, 0.1, 0.1, 0.3]  # A's 0.2 s gap carried two tokens


def quantile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy 'linear' = R7 = 'inclusive')."""
    if p == 50:
        return statistics.median(values)
    cuts = statistics.quantiles(values, n=1000, method="inclusive")
    return cuts[round(p * 10) - 1]


@pytest.fixture(scope="module")
def mixed() -> dict[str, object]:
    return summarize([REC_A, REC_B, REC_C, failure("HTTP 500: boom"), failure("HTTP 500: boom"),
                      NO_CHUNK], duration_s=2.0, num_prompts=6, max_concurrency=4, num_gpus=2)


def test_counts_and_throughputs(mixed: dict[str, object]) -> None:
    assert mixed["completed"] == 3
    assert mixed["failed"] == 3
    assert mixed["num_prompts"] == 6
    assert mixed["max_concurrency"] == 4
    assert mixed["duration"] == 2.0
    assert mixed["total_input_tokens"] == 10 + 20 + 30  # successful requests only, as vLLM
    assert mixed["total_output_tokens"] == 4 + 1 + 3
    assert mixed["request_throughput"] == pytest.approx(3 / 2.0)
    assert mixed["output_throughput"] == pytest.approx(8 / 2.0)
    assert mixed["total_token_throughput"] == pytest.approx(68 / 2.0)
    assert mixed["request_goodput:"] is None
    assert mixed["errors"] == {"HTTP 500: boom": 2, NO_CHUNK_ERROR: 1}


@pytest.mark.parametrize(("name", "samples"), [
    ("ttft", TTFT), ("e2el", E2EL), ("tpot", TPOT), ("itl", CHUNK_ITL),
    ("itl_per_token", TOKEN_ITL)])
def test_latency_statistics(mixed: dict[str, object], name: str, samples: list[float]) -> None:
    assert mixed[f"mean_{name}_ms"] == pytest.approx(statistics.fmean(samples) * 1000)
    assert mixed[f"median_{name}_ms"] == pytest.approx(statistics.median(samples) * 1000)
    assert mixed[f"std_{name}_ms"] == pytest.approx(statistics.pstdev(samples) * 1000)
    for p in (90, 99, 99.9):
        assert mixed[f"p{percentile_label(p)}_{name}_ms"] == pytest.approx(
            quantile(samples, p) * 1000)


def test_percentile_keys_follow_vllm_labels(mixed: dict[str, object]) -> None:
    assert {"p90_ttft_ms", "p99_ttft_ms", "p99.9_ttft_ms"} <= set(mixed)
    assert "p90.0_ttft_ms" not in mixed


def test_inferencex_aggregates(mixed: dict[str, object]) -> None:
    assert mixed["tput_per_gpu"] == pytest.approx(68 / 2.0 / 2)
    assert mixed["output_tput_per_gpu"] == pytest.approx(8 / 2.0 / 2)
    assert mixed["input_tput_per_gpu"] == pytest.approx(60 / 2.0 / 2)
    assert mixed["median_ttft"] == pytest.approx(statistics.median(TTFT))
    assert mixed["p99.9_e2el"] == pytest.approx(quantile(E2EL, 99.9))
    assert mixed["median_itl_per_token"] == pytest.approx(statistics.median(TOKEN_ITL))
    assert mixed["median_intvty"] == pytest.approx(1 / statistics.median(TPOT))
    assert mixed["p99_intvty"] == pytest.approx(1 / quantile(TPOT, 99))  # InferenceX: at P99 TPOT


def test_chunk_accounting(mixed: dict[str, object]) -> None:
    assert mixed["total_chunks"] == 3 + 1 + 3
    assert mixed["mean_tokens_per_chunk"] == pytest.approx(8 / 7)
    assert mixed["chunk_token_total"] == 8
    assert mixed["token_accounting_ok"] is True
    assert mixed["token_mismatch_requests"] == 0
    assert mixed["achieved_concurrency"] == pytest.approx(sum(E2EL) / 2.0)


def test_token_mismatch_is_flagged() -> None:
    short = record(0.0, [0.1, 0.2], [1, 1], out=5)  # server says 5, the stream carried 2
    s = summarize([short, REC_C], duration_s=1.0, num_prompts=2, max_concurrency=2, num_gpus=1)
    assert s["token_mismatch_requests"] == 1
    assert s["token_accounting_ok"] is False
    assert s["total_output_tokens"] == 5 + 3  # server usage stays the primary count


def test_goodput_requires_every_slo() -> None:
    records = [REC_A, REC_B, REC_C]
    only_ttft = summarize(records, duration_s=2.0, num_prompts=3, max_concurrency=3, num_gpus=1,
                          goodput_slos={"ttft": 100.0})
    assert only_ttft["request_goodput:"] == pytest.approx(2 / 2.0)  # A (at the limit) and C
    both = summarize(records, duration_s=2.0, num_prompts=3, max_concurrency=3, num_gpus=1,
                     goodput_slos={"ttft": 100.0, "tpot": 150.0})
    assert both["request_goodput:"] == pytest.approx(1 / 2.0)  # C's TPOT is 200 ms
    with pytest.raises(ValueError, match="itl"):
        summarize(records, duration_s=2.0, num_prompts=3, max_concurrency=3, num_gpus=1,
                  goodput_slos={"itl": 5.0})


def test_single_token_outputs_have_no_tpot() -> None:
    s = summarize([REC_B, record(2.0, [2.3], [1])], duration_s=1.0, num_prompts=2,
                  max_concurrency=2, num_gpus=1, goodput_slos={"tpot": 1.0})
    assert s["completed"] == 2
    assert s["median_ttft_ms"] == pytest.approx(statistics.median([0.2, 0.3]) * 1000)
    assert s["mean_tpot_ms"] == 0.0
    assert s["median_intvty"] is None  # 1000 / 0 would raise in InferenceX
    assert s["mean_itl_ms"] == 0.0
    assert s["request_goodput:"] == pytest.approx(2.0)  # TPOT counts as 0 for goodput, as vLLM


def test_zero_completed_requests() -> None:
    s = summarize([failure("connect: refused"), failure("stream ended without [DONE]"),
                   failure("connect: refused")], duration_s=3.0, num_prompts=3,
                  max_concurrency=1, num_gpus=8, goodput_slos={"e2el": 10.0})
    assert s["completed"] == 0
    assert s["failed"] == 3
    assert s["errors"] == {"connect: refused": 2, "stream ended without [DONE]": 1}
    assert s["total_output_tokens"] == 0
    assert s["request_throughput"] == 0.0
    assert s["request_goodput:"] == 0.0
    for name in ("ttft", "tpot", "itl", "e2el", "itl_per_token"):
        assert s[f"median_{name}_ms"] == 0.0
        assert s[f"p99.9_{name}_ms"] == 0.0
    assert s["tput_per_gpu"] == 0.0
    assert s["median_intvty"] is None
    assert s["mean_tokens_per_chunk"] == 0.0


def test_no_records_and_zero_duration() -> None:
    s = summarize([], duration_s=0.0, num_prompts=0, max_concurrency=1, num_gpus=0)
    assert s["completed"] == 0
    assert s["failed"] == 0
    assert s["output_throughput"] == 0.0
    assert s["tput_per_gpu"] == 0.0


def test_custom_percentiles() -> None:
    s = summarize([REC_A, REC_C], duration_s=1.0, num_prompts=2, max_concurrency=2, num_gpus=1,
                  percentiles=(25, 75))
    assert s["p25_ttft_ms"] == pytest.approx(
        statistics.quantiles([0.1, 0.05], n=4, method="inclusive")[0] * 1000)
    assert "p99_ttft_ms" not in s


def test_token_weighted_itl_matches_expanded_samples_at_scale() -> None:
    """Many records with mixed chunk sizes: per-token stats equal those of the expanded list."""
    rng = np.random.default_rng(7)
    records, chunk_gaps, token_gaps = [], [], []
    for i in range(200):
        n = int(rng.integers(1, 40))
        tokens = rng.integers(1, 5, n)
        times = i + 0.2 + np.cumsum(rng.uniform(0.001, 0.05, n))
        records.append(RequestRecord(i, float(times[-1]), 100, int(tokens.sum()), True,
                                     times, tokens))
        for k in range(1, n):
            gap = float(times[k] - times[k - 1])
            chunk_gaps.append(gap)
            token_gaps.extend([gap / int(tokens[k])] * int(tokens[k]))
    s = summarize(records, duration_s=200.0, num_prompts=200, max_concurrency=1, num_gpus=1)
    assert s["mean_itl_per_token_ms"] == pytest.approx(statistics.fmean(token_gaps) * 1000)
    assert s["std_itl_per_token_ms"] == pytest.approx(statistics.pstdev(token_gaps) * 1000)
    assert s["median_itl_ms"] == pytest.approx(statistics.median(chunk_gaps) * 1000)
    for p in (50, 90, 99, 99.9):
        key = "median" if p == 50 else f"p{percentile_label(p)}"
        assert s[f"{key}_itl_per_token_ms"] == pytest.approx(quantile(token_gaps, p) * 1000,
                                                             rel=1e-9)


def test_one_token_per_chunk_per_token_itl_is_the_chunk_itl() -> None:
    s = summarize([REC_C], duration_s=1.0, num_prompts=1, max_concurrency=1, num_gpus=1)
    for stat in ("mean", "median", "std", "p90", "p99", "p99.9"):
        assert s[f"{stat}_itl_per_token_ms"] == s[f"{stat}_itl_ms"]
    assert s["median_itl_per_token_ms"] == pytest.approx(statistics.median([0.1, 0.3]) * 1000)
