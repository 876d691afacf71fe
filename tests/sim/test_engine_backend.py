"""The `sim` backend: a launch spec's argv in, simulated measurements out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pytest_inferbench.backends import get_backend
from pytest_inferbench.backends.base import LoadSettings, ServerStartError, StartContext
from pytest_inferbench.loadgen.workload import poisson_offsets
from pytest_inferbench.recipe.launch import ClientOptions, ServerSpec
from pytest_inferbench.recipe.model import Parallelism, SeqLenSweep, ServerConfig
from pytest_inferbench.results.measurement import SIMULATED_NOTE
from pytest_inferbench.results.metrics import summarize

ARGV = ("python3", "-m", "atom.entrypoints.openai_server", "--model", "{model}",
        "--server-port", "{port}", "-tp", "4", "--block-size", "128",
        "--gpu-memory-utilization", "0.8", "--max-num-batched-tokens", "32768",
        "--max-num-seqs", "256", "--kv_cache_dtype", "fp8", "--trust-remote-code")


def server(model: str = "amd/MiniMax-M3-MXFP4", hardware: str = "MI355X",
           tp: int = 4) -> ServerConfig:
    return ServerConfig(
        config_key="minimaxm3-fp4-mi355x-atom", image="rocm/atom-dev:test", model=model,
        model_prefix="minimaxm3", runner=hardware.lower(), hardware=hardware, precision="fp4",
        framework="atom", multinode=False, disagg=False, parallel=Parallelism(tp=tp),
        spec_decoding="none", sweeps=(SeqLenSweep(1024, 1024, (1, 8), line=1),),
        source=Path("amd-master.yaml"), line=1)


def spec(node: ServerConfig, argv: tuple[str, ...] = ARGV) -> ServerSpec:
    return ServerSpec(
        image=node.image, argv=tuple(a.replace("{model}", node.model) for a in argv), env=(),
        port=8888, health_path="/health", startup_timeout_s=60.0, gpu_count=node.parallel.tp,
        served_model=node.model, hardware=node.hardware, framework="atom",
        client=ClientOptions(), launch_file=Path("launch/minimaxm3_fp4_mi355x_atom.yaml"))


CTX = StartContext(results_dir=Path("."), run_id="t", worker_id="master", options=None)


def test_default_backend_runs_points_and_says_they_are_simulated() -> None:
    node = server()
    backend = get_backend("sim")
    handle = backend.start(node, spec(node), CTX)
    try:
        assert handle.base_url is None
        load = LoadSettings(prompts_per_conc=3, warmup_per_conc=1)
        first, second = (handle.run_point(p, load) for p in node.points())
    finally:
        handle.stop()
        handle.stop()  # idempotent
    for m, conc in ((first, 1), (second, 8)):
        assert m.simulated and m.max_concurrency == conc and m.num_prompts == 3 * conc
        assert len(m.records) == 3 * conc
        assert SIMULATED_NOTE in m.notes
        for r in m.records:
            assert r.success and r.output_tokens == int(r.tokens_per_chunk().sum())
            assert 819 <= r.output_tokens <= 1024 and 819 <= r.input_tokens <= 1024
            assert r.send_time <= r.chunk_times[0] and r.chunk_times[-1] == r.end_time
            assert np.all(np.diff(r.chunk_times) > 0)
        s = summarize(m.records, duration_s=m.duration_s, num_prompts=m.num_prompts,
                      max_concurrency=conc, num_gpus=4)
        assert s["completed"] == 3 * conc and s["mean_tpot_ms"] > 0
    # The unmodelled flag is reported once, on the node's first point.
    assert any("--trust-remote-code" in n for n in first.notes)
    assert not any("--trust-remote-code" in n for n in second.notes)


def test_points_do_not_depend_on_what_ran_before() -> None:
    node = server()
    load = LoadSettings(prompts_per_conc=2, warmup_per_conc=1)
    point = node.points()[1]
    alone = get_backend("sim").start(node, spec(node), CTX).run_point(point, load)
    handle = get_backend("sim").start(node, spec(node), CTX)
    handle.run_point(node.points()[0], load)
    after = handle.run_point(point, load)
    assert [r.end_time for r in alone.records] == [r.end_time for r in after.records]


def test_weights_that_do_not_fit_fail_the_setup_with_the_reason() -> None:
    node = server(model="MiniMaxAI/MiniMax-M3-MXFP8", hardware="H100")
    with pytest.raises(ServerStartError, match="weights do not fit"):
        get_backend("sim").start(node, spec(node), CTX)


def test_bad_argv_fails_the_setup_naming_the_launch_file() -> None:
    node = server()
    with pytest.raises(ServerStartError, match=r"minimaxm3_fp4_mi355x_atom\.yaml.*not a number"):
        get_backend("sim").start(node, spec(node, (*ARGV, "--max-num-seqs", "lots")), CTX)


def test_finite_request_rate_sends_on_poisson_arrivals_under_the_concurrency_cap() -> None:
    node = server()
    handle = get_backend("sim").start(node, spec(node), CTX)
    slow = LoadSettings(prompts_per_conc=3, warmup_per_conc=0, request_rate=0.5)
    m = handle.run_point(node.points()[1], slow)  # conc 8: a request lasts ~7 s, 0.5 req/s
    due = np.asarray(poisson_offsets(0.5, 24, seed=0))
    assert 1 / np.diff(due).mean() == pytest.approx(0.5, rel=0.5)
    sends = np.array([r.send_time for r in m.records])
    ends = np.array([r.end_time for r in m.records])
    assert np.all(sends >= due - 1e-9)
    waited = 0
    for i, t in enumerate(sends):
        others = np.arange(len(sends)) != i
        assert np.sum(others & (sends <= t) & (ends > t)) < 8  # the cap holds at every send
        busy_when_due = np.sum(others & (sends <= due[i]) & (ends > due[i]))
        if busy_when_due < 8:
            assert t == pytest.approx(due[i])  # a free permit: sent when due
        else:
            waited += 1
            assert t == pytest.approx(ends[ends <= t].max())  # sent when a permit came back
    assert waited > 0  # this rate does fill the 8 permits at times
    # conc 1 and a rate far above what one stream serves: each send waits for the last finish.
    busy = handle.run_point(node.points()[0], LoadSettings(prompts_per_conc=5, warmup_per_conc=0,
                                                           request_rate=100.0))
    busy_ends = [r.end_time for r in busy.records]
    assert [r.send_time for r in busy.records][1:] == pytest.approx(busy_ends[:-1])
