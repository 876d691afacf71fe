"""Without CUDA/HIP graphs (vLLM / ATOM `--enforce-eager`, SGLang `--disable-cuda-graph`) every
step pays the host's kernel launches per layer on top of the profile's overhead, which was
fitted with graphs (sim/efficiency.py, docs/simulator.md "Step time")."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_inferbench.sim import catalog
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.efficiency import EAGER_S_PER_LAYER, Efficiency
from pytest_inferbench.sim.engine import Engine

MODEL = "openai/gpt-oss-120b"
LAYERS = catalog.checkpoint(MODEL).architecture.layers
VLLM = ["vllm", "serve", MODEL, "-tp", "8"]
SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", MODEL, "--tp", "8"]
ATOM = ["python", "-m", "atom.entrypoints.openai_server", "--model", MODEL, "-tp", "8"]


def decode_step_s(argv: list[str], efficiency: Efficiency | None = None) -> float:
    """One decode step of one sequence at a short context (latency-bound)."""
    config, ignored = engine_config_from_argv(argv, hardware="B200", env={})
    assert not any("eager" in word or "cuda-graph" in word for word in ignored), ignored
    engine = Engine(dataclasses.replace(config, efficiency=efficiency))
    return float(engine.cost.step(decode_seqs=1.0, decode_ctx=1024.0, decode_ctx_win=1024.0))


@pytest.mark.parametrize(("argv", "flag"), [(VLLM, "--enforce-eager"),
                                            (ATOM, "--enforce-eager"),
                                            (SGLANG, "--disable-cuda-graph")])
def test_an_eager_step_pays_the_hosts_launches_per_layer(argv: list[str], flag: str) -> None:
    graphs, eager = decode_step_s(argv), decode_step_s([*argv, flag])
    assert eager - graphs == pytest.approx(LAYERS * EAGER_S_PER_LAYER, rel=1e-6)


def test_a_calibrated_overhead_is_the_measured_servers_and_is_used_as_is() -> None:
    knobs = Efficiency(step_overhead_s=0.003, hbm_efficiency=0.8, compute_efficiency=0.2)
    assert decode_step_s([*VLLM, "--enforce-eager"], knobs) == decode_step_s(VLLM, knobs)
