"""The latency of the per-layer collectives is the interconnect's and grows with the GPUs that
take part (sim/catalog/hardware.yaml `collective_us`): a small-batch decode step on 8 GPUs pays
more of it than on 2, and far more over PCIe than over NVLink."""

from __future__ import annotations

import pytest

from pytest_inferbench.sim import catalog
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.engine import Engine

MODEL = "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"


def decode_step_s(hardware: str, tp: int) -> float:
    """One decode step of one sequence at a short context (launch- and latency-bound)."""
    config, _ = engine_config_from_argv(["vllm", "serve", MODEL, "-tp", str(tp)],
                                        hardware=hardware, env={})
    return float(Engine(config).cost.step(decode_seqs=1.0, decode_ctx=1024.0,
                                          decode_ctx_win=1024.0))


def test_one_gpu_pays_no_collective_latency() -> None:
    assert catalog.hardware("H100").collective_latency_s(1) == 0.0


@pytest.mark.parametrize("hardware", ["H100", "MI355X", "RTX6000PRO"])
def test_the_latency_grows_with_the_gpus_taking_part(hardware: str) -> None:
    hw = catalog.hardware(hardware)
    latencies = [hw.collective_latency_s(t) for t in (2, 4, 8)]
    assert 0.0 < latencies[0] < latencies[1] < latencies[2]


def test_the_measured_small_message_latencies_are_what_the_catalog_gives() -> None:
    """The microbenchmarks the catalog cites: sglang PR #2904 (8 x H100, custom all-reduce,
    3.7-4.5 us at TP2 and 5.7-7.8 us at TP8 for 512 B - 32 KB) and vllm PR #39080 (MI355X TP8,
    6.3 us)."""
    h100, mi355x = catalog.hardware("H100"), catalog.hardware("MI355X")
    assert 3.7e-6 <= h100.collective_latency_s(2) <= 4.5e-6
    assert 5.7e-6 <= h100.collective_latency_s(8) <= 7.8e-6
    assert mi355x.collective_latency_s(8) == pytest.approx(6.3e-6, rel=0.05)


@pytest.mark.parametrize(("hardware", "tp"), [("H200", 2), ("H100", 8), ("MI355X", 8),
                                             ("RTX6000PRO", 4)])
def test_every_framework_prices_the_collectives_at_the_interconnects_latency(
        hardware: str, tp: int) -> None:
    want = catalog.hardware(hardware).collective_latency_s(tp)
    for argv in (["vllm", "serve", MODEL, "-tp", str(tp)],
                 ["python3", "-m", "sglang.launch_server", "--model-path", MODEL, "--tp", str(tp)],
                 ["python", "-m", "atom.entrypoints.openai_server", "--model", MODEL, "-tp",
                  str(tp)]):
        config, _ = engine_config_from_argv(argv, hardware=hardware, env={})
        assert Engine(config).cost.allreduce_latency_s == want, argv


def test_a_small_batch_step_on_8_gpus_pays_more_latency_than_on_4() -> None:
    """Same chip, same model: going from 4 to 8 GPUs halves the weights each GPU streams but
    adds the latency of 2 collectives per layer among more peers (vs a flat figure)."""
    layers = catalog.checkpoint(MODEL).architecture.layers
    h100 = catalog.hardware("H100")
    added = 2 * layers * (h100.collective_latency_s(8) - h100.collective_latency_s(4))
    assert added > 0
    tp4, tp8 = decode_step_s("H100", 4), decode_step_s("H100", 8)
    assert tp8 < tp4  # the halved weights still win at this size
    assert tp8 > tp4 / 2 + added  # but far from a halving: fixed costs and latency stay
