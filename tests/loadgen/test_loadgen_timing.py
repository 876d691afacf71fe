"""Done-when check: the client's timings against the simulated server's own timeline.

The simulator (ATOM persona, MiniMax-M3 with EAGLE3 k=3, time scale 1: real time) records when
each request arrived and when each engine step's tokens were sent (`/debug/inferbench/timeline`,
on CLOCK_MONOTONIC, the clock of the client's `perf_counter` too). The client must reproduce it.

The server stamps a request's arrival only after reading and parsing it; that intake delay is
the server's (several ms on a loaded 2-core machine, the same for every client), so the
server-side TTFT used here starts at the client's wire time (`send_time`) and ends at the first
emission. The arrival-based TTFT is printed next to it.

Every client stamp lies after the server's emission by the delivery delay: the kernel and the
client's event loop. On a busy machine that delay is scheduling noise, and the client measures
it as its event-loop lag (the self-check), stall by stall with their times. The bounds are a
fixed share of each metric plus the lag measured during this very run, so a loaded machine
widens them by what it did to the client and an idle one leaves them tight; a client that
stamps late for its own reasons (or on another clock) exceeds them. TPOT is judged request by
request: a request's first and last stamps may be late by the stalls that covered them, and no
more. Figures on this machine: `benchmarks/bench_client_timing.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest

from pytest_inferbench.backends.base import LoadSettings
from pytest_inferbench.backends.http import HttpServerHandle
from pytest_inferbench.loadgen.selfcheck import DEFAULT_INTERVAL_S, LAG_FLOOR_S
from pytest_inferbench.results.metrics import first_send, summarize

if TYPE_CHECKING:
    import types

    from pytest_inferbench.results.measurement import PointMeasurement
    from pytest_inferbench.sim.server.launcher import SimServer

CONC = 64
# A stall shorter than the ticker's interval can fall between two wake-ups, and one shorter
# than the floor is not listed: either may hide in any stamp.
UNLISTED_STALL_S = DEFAULT_INTERVAL_S + LAG_FLOOR_S


def stall_over(stalls: np.ndarray, start: float, end: float) -> float:
    """The longest listed client stall overlapping [start, end] (s), 0 when none did."""
    if not stalls.size:
        return 0.0
    hit = (stalls[:, 0] <= end) & (stalls[:, 0] + stalls[:, 1] >= start)
    return float(stalls[hit, 1].max()) if hit.any() else 0.0


def stall_excess(m: PointMeasurement, truth: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per request, how much its client TTFT and TPOT exceed the server's (s) beyond what the
    stalls over its first and last stamps, and the unlisted ones, could add to them."""
    listed = m.client_check["stalls"]
    stalls = np.asarray(listed, dtype=np.float64).reshape(-1, 2)
    stalls = np.column_stack([stalls[:, 0] + first_send(m.records), stalls[:, 1] / 1000])

    def allowed(emitted: float, stamped: float) -> float:
        # The stamp may wait for a stall that began before the chunk arrived, up to one
        # ticker interval earlier (the ticker was not yet due).
        return stall_over(stalls, emitted - DEFAULT_INTERVAL_S, stamped) + UNLISTED_STALL_S

    ttft, tpot = [], []
    for r in m.records:
        emitted = truth["emitted"][r.request_id]
        first = allowed(emitted[0], r.chunk_times[0])
        last = allowed(emitted[-1], r.chunk_times[-1])
        ttft.append((r.chunk_times[0] - emitted[0]) - first)
        gaps = r.output_tokens - 1
        error = abs((r.chunk_times[-1] - r.chunk_times[0]) - (emitted[-1] - emitted[0])) / gaps
        tpot.append(error - max(first, last) / gaps)
    return np.asarray(ttft), np.asarray(tpot)


def server_truth(m: PointMeasurement, timeline: dict[str, Any]) -> dict[str, Any]:
    offset = float(timeline["perf_counter_minus_monotonic"])
    by_id = {t["id"]: t for t in timeline["requests"]}
    ttft_wire, ttft_arrival, tpot, gaps, gap_tokens, late, early = [], [], [], [], [], [], []
    emitted_at = {}
    for r in m.records:
        t = by_id[r.request_id]
        emitted = np.asarray(t["emissions"], dtype=np.float64)
        times, tokens = emitted[:, 0] + offset, emitted[:, 1].astype(np.int64)
        emitted_at[r.request_id] = times
        assert len(times) == len(r.chunk_times), "one SSE chunk per engine delivery"
        assert list(tokens) == list(r.chunk_tokens)
        assert int(tokens.sum()) == r.output_tokens == t["completion_tokens"]
        delay = r.chunk_times - times
        late.append(delay)
        early.append(float(delay.min()))
        ttft_wire.append(times[0] - r.send_time)
        ttft_arrival.append(times[0] - (t["arrival"] + offset))
        n = int(tokens.sum())
        if n > 1:
            tpot.append((times[-1] - times[0]) / (n - 1))
        gaps.append(np.diff(times))
        gap_tokens.append(tokens[1:])
    all_gaps, all_tokens = np.concatenate(gaps), np.concatenate(gap_tokens)
    per_token = np.repeat(all_gaps / all_tokens, all_tokens)
    return {
        "ttft_ms": float(np.median(ttft_wire)) * 1000,
        "ttft_from_arrival_ms": float(np.median(ttft_arrival)) * 1000,
        "tpot_ms": float(np.median(tpot)) * 1000,
        "itl_per_token_ms": float(np.median(per_token)) * 1000,
        "tokens_per_later_chunk": float(all_tokens.mean()),
        "delay_ms": np.percentile(np.concatenate(late), [50, 99, 100]) * 1000,
        "earliest_delay_ms": min(early) * 1000,
        "emitted": emitted_at,
    }


@pytest.mark.slow
def test_client_matches_the_server_timeline_under_eagle3(
        eagle_server: SimServer, helpers: types.ModuleType) -> None:
    handle = HttpServerHandle(
        base_url=eagle_server.base_url,
        spec=helpers.spec_for((*helpers.ATOM_ARGV, *helpers.EAGLE3), chat_template=True),
        simulated=True)
    point = helpers.server_config("mtp", isl=1024, osl=64, conc=CONC).points()[0]
    m = handle.run_point(point, LoadSettings(prompts_per_conc=2, warmup_per_conc=1))
    timeline = httpx.get(eagle_server.base_url + "/debug/inferbench/timeline",
                         timeout=30).json()
    s = summarize(m.records, duration_s=m.duration_s, num_prompts=m.num_prompts,
                  max_concurrency=CONC, num_gpus=4)
    truth = server_truth(m, timeline)
    ttft_excess_ms, tpot_excess_ms = (e * 1000 for e in stall_excess(m, truth))
    al = m.server_metrics["acceptance_length"]
    print(f"\nclient vs server at conc {CONC}, EAGLE3 (server AL {al:.3f}):"
          f"\n  TTFT median {s['median_ttft_ms']:.2f} vs {truth['ttft_ms']:.2f} ms"
          f" (from the server's arrival stamp: {truth['ttft_from_arrival_ms']:.2f} ms); per"
          f" request, beyond the stalls over its first stamp: median"
          f" {np.median(ttft_excess_ms):.3f} ms, max {ttft_excess_ms.max():.3f} ms"
          f"\n  TPOT median {s['median_tpot_ms']:.3f} vs {truth['tpot_ms']:.3f} ms; per request,"
          f" error beyond the stalls over its ends: median {np.median(tpot_excess_ms):.3f} ms,"
          f" max {tpot_excess_ms.max():.3f} ms"
          f"\n  per-token ITL median {s['median_itl_per_token_ms']:.3f}"
          f" vs {truth['itl_per_token_ms']:.3f} ms"
          f"\n  chunk ITL median {s['median_itl_ms']:.3f} ms,"
          f" mean chunk/per-token ITL {s['mean_itl_ms'] / s['mean_itl_per_token_ms']:.3f}"
          f"\n  chunk stamp after emission p50/p99/max {truth['delay_ms'].round(3)} ms"
          f"\n  self-check {m.client_check}")

    assert s["completed"] == m.num_prompts == 2 * CONC
    assert s["token_accounting_ok"] and s["chunk_token_total"] == s["total_output_tokens"]
    assert truth["earliest_delay_ms"] >= 0  # no chunk is stamped before the server sent it
    # Requests start and finish together, so one stall (a loaded machine descheduling the
    # client, or the client working through a burst of 64 chunks) delays the first or last
    # stamps of half of them at once and moves a median by more than any typical lag. Each
    # request is allowed the stalls that covered its own stamps; the median request stays
    # within 1% beyond that. A client that stamps a first or last chunk late for its own
    # reasons (or on another clock) does not. TPOT is two stamps over n - 1 gaps.
    assert np.median(ttft_excess_ms) <= 0.01 * truth["ttft_ms"]
    assert np.median(tpot_excess_ms) <= 0.01 * truth["tpot_ms"]
    # The lag is sampled once per wake-up, so a long stall is one sample while the chunks that
    # arrive during it are many: the tail (p99), not the typical lag, bounds a median delay.
    tail_ms = m.client_check["lag_p99_ms"]
    assert (abs(s["median_itl_per_token_ms"] - truth["itl_per_token_ms"])
            <= 0.02 * truth["itl_per_token_ms"] + tail_ms)
    # Chunk ITL (vLLM's) counts one sample per speculative step: it is the per-token ITL times
    # the tokens each step carried, exactly the server's tokens per later emission, i.e. ~AL.
    ratio = s["mean_itl_ms"] / s["mean_itl_per_token_ms"]
    assert ratio == pytest.approx(truth["tokens_per_later_chunk"], rel=1e-6)
    assert ratio == pytest.approx(al, rel=0.1)
    assert s["median_itl_ms"] / s["median_itl_per_token_ms"] == pytest.approx(al, rel=0.1)
