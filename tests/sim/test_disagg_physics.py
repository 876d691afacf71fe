"""Physics sanity of disaggregated serving (docs/simulator.md, "Multinode deployments").

- With the same GPUs, disaggregation lowers TPOT for long prompts at high concurrency (decode
  steps no longer carry prefill chunks) and costs TTFT (the transfer and the decode admission).
- More decode workers raise throughput until the prefill pool saturates, and the reverse; a
  saturated prefill pool caps throughput at its own prefill rate.
- A rack-scale NVLink domain moves the KV cache faster than RDMA NICs, by their bandwidths.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pytest_inferbench.loadgen.workload import LoadSettings, build_workload
from pytest_inferbench.results.metrics import summarize
from pytest_inferbench.sim.cluster_driver import simulate_deployment_point
from pytest_inferbench.sim.config import EngineConfig
from pytest_inferbench.sim.disagg import Deployment, Pool, kv_transfer
from pytest_inferbench.sim.engine import Engine

M3 = EngineConfig(hardware="MI355X", model="amd/MiniMax-M3-MXFP4", framework="vllm", tp=4,
                  kv_cache_dtype="fp8", block_size=128, max_num_batched_tokens=16384,
                  max_model_len=10000, max_num_seqs=256)
R1 = EngineConfig(hardware="GB200", model="nvidia/DeepSeek-R1-0528-FP4-V2", framework="trt",
                  tp=8, ep=8, kv_cache_dtype="fp8", block_size=32, max_num_batched_tokens=8192,
                  max_model_len=10000, max_num_seqs=256)


def run(dep: Deployment, conc: int, isl: int = 8192, osl: int = 1024, per_conc: int = 2
        ) -> dict[str, float]:
    workload = build_workload(isl, osl, conc, LoadSettings(prompts_per_conc=per_conc,
                                                           warmup_per_conc=1))
    point = simulate_deployment_point(dep, workload)
    stats = summarize(point.records, duration_s=point.duration_s,
                      num_prompts=len(workload.requests), max_concurrency=conc,
                      num_gpus=dep.gpus)
    return {k: float(v) for k, v in stats.items()  # type: ignore[arg-type]
            if k in ("mean_ttft_ms", "mean_tpot_ms", "output_throughput")}


def disagg(prefill: int, decode: int, config: EngineConfig = M3) -> Deployment:
    return Deployment(Pool("prefill", config, prefill), Pool("decode", config, decode))


def test_same_gpus_disaggregation_lowers_tpot_at_high_concurrency_and_costs_ttft() -> None:
    agg = run(Deployment(Pool("aggregated", M3, 2)), conc=64)
    dis = run(disagg(1, 1), conc=64)
    # Aggregated decode steps carry 16k-token prefill chunks; disaggregated ones never do.
    assert dis["mean_tpot_ms"] < 0.8 * agg["mean_tpot_ms"]
    assert dis["mean_ttft_ms"] > agg["mean_ttft_ms"]
    # Alone, a request's first token waits for exactly its transfer and decode admission.
    one_agg = run(Deployment(Pool("aggregated", M3, 2)), conc=1, per_conc=1)
    one_dis = run(disagg(1, 1), conc=1, per_conc=1)
    transfer = kv_transfer(disagg(1, 1))
    assert transfer is not None
    assert one_dis["mean_ttft_ms"] > one_agg["mean_ttft_ms"] + 1e3 * transfer.latency_s


def prefill_rate_tokens_per_s(config: EngineConfig) -> float:
    """Prompt tokens one prefill worker computes per second: full chunked-prefill steps."""
    engine = Engine(config)
    engine.add_request(1, 9000, 1)
    engine.add_request(2, 9000, 1)
    step = engine.step()  # 16384 prompt tokens of two prompts
    return config.max_num_batched_tokens / step.duration_s


def test_decode_workers_raise_throughput_until_the_prefill_pool_saturates() -> None:
    # One prefill worker at concurrency 256 of 8k prompts: prefill-bound. Its rate caps the
    # output: (prompts per second it prefills) x the mean output length.
    mean_isl, mean_osl = (0.8 * 8192 + 8192) / 2, (0.8 * 1024 + 1024) / 2
    cap = prefill_rate_tokens_per_s(M3) / mean_isl * mean_osl
    d1, d2 = (run(disagg(1, d), conc=256)["output_throughput"] for d in (1, 2))
    assert d1 == pytest.approx(cap, rel=0.12) and d2 <= 1.05 * cap
    assert d2 == pytest.approx(d1, rel=0.05)
    # Four prefill workers keep up: then a second decode worker adds throughput.
    p4d1, p4d2 = (run(disagg(4, d), conc=256)["output_throughput"] for d in (1, 2))
    assert p4d2 > 1.1 * p4d1
    assert p4d1 > 2 * d1


def test_prefill_workers_raise_throughput_until_the_decode_pool_saturates() -> None:
    tput = {p: run(disagg(p, 1), conc=256)["output_throughput"] for p in (1, 2, 8, 16)}
    assert tput[2] > 1.5 * tput[1]
    assert tput[16] < 1.1 * tput[8]  # one decode worker's batch is the limit now


def test_rack_nvlink_moves_the_kv_cache_faster_than_rdma() -> None:
    # 2 prefill + 2 decode workers of 8 GPUs: one NVL72 rack on GB200, four HGX nodes on
    # B200 (same GPU side), whose KV moves over 400 Gb/s NICs.
    rack = disagg(2, 2, R1)
    nodes = disagg(2, 2, replace(R1, hardware="B200"))
    fast, slow = kv_transfer(rack), kv_transfer(nodes)
    assert fast is not None and slow is not None
    assert (fast.fabric, slow.fabric) == ("scale-up", "rdma")
    prompt = 8000
    wire_fast = fast.seconds(prompt) - fast.latency_s
    wire_slow = slow.seconds(prompt) - slow.latency_s
    assert wire_slow / wire_fast == pytest.approx(900 / 50)  # NVLink5 vs ConnectX-7 per GPU
    # End to end, a lone request's TTFT differs by that transfer alone.
    ttft_fast = run(rack, conc=1, isl=prompt, osl=8, per_conc=1)["mean_ttft_ms"]
    ttft_slow = run(nodes, conc=1, isl=prompt, osl=8, per_conc=1)["mean_ttft_ms"]
    assert ttft_slow > ttft_fast
