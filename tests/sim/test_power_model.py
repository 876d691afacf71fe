"""The simulator's power model: each GPU's mean power over a simulated point, from its board's
idle and rated power and what the engine's steps did, run through the real in-process backend
(`SimHandle.run_point`) and the record builder, as a recipe point is.

No figure of the model is repeated here: the checks are the ones that hold for any idle / rated
power and share, read from the catalog itself.
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_inferbench.backends.base import LoadSettings
from pytest_inferbench.backends.sim import SimHandle
from pytest_inferbench.recipe.launch import ClientOptions
from pytest_inferbench.recipe.model import BenchPoint, Parallelism, SeqLenSweep, ServerConfig
from pytest_inferbench.results.build import build_result
from pytest_inferbench.results.measurement import PointMeasurement
from pytest_inferbench.sim import catalog, power
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]

MODEL = "amd/MiniMax-M3-MXFP4"
ARGV = ("python3", "-m", "atom.entrypoints.openai_server", "--model", MODEL, "-tp", "4",
        "--block-size", "128", "--max-model-len", "32768", "--max-num-batched-tokens", "32768",
        "--max-num-seqs", "256", "--kv_cache_dtype", "fp8")


def handle() -> SimHandle:
    config, ignored = engine_config_from_argv(ARGV, hardware="MI355X", framework="atom")
    return SimHandle("power-test", config, ignored, ClientOptions())


def bench_point(isl: int, osl: int, conc: int) -> BenchPoint:
    return ServerConfig(
        config_key="minimaxm3-fp4-mi355x-atom", image="sim", model=MODEL,
        model_prefix="minimaxm3", runner="mi355x", hardware="MI355X", precision="fp4",
        framework="atom", multinode=False, disagg=False, parallel=Parallelism(tp=4),
        spec_decoding="none", sweeps=(SeqLenSweep(isl, osl, (conc,), 1),),
        source=Path("power-test.yaml"), line=1).points()[0]


def measure(isl: int, osl: int, conc: int, **load: float) -> PointMeasurement:
    return handle().run_point(bench_point(isl, osl, conc),
                              LoadSettings(prompts_per_conc=4, warmup_per_conc=1, **load))


def watts(m: PointMeasurement) -> float:
    assert m.power is not None and m.power.valid and m.power.avg_power_w is not None
    return m.power.avg_power_w


def test_every_catalog_gpu_has_power_figures_with_their_sources() -> None:
    for name in catalog.hardware_names():
        figures = power.gpu_power(name)
        assert 0 < figures.idle_w < figures.tdp_w, name
        assert figures.tdp_source and figures.idle_source, name
    assert 0 < power.memory_bound_share() < 1


def test_an_unknown_gpu_is_named_with_the_known_ones() -> None:
    with pytest.raises(catalog.CatalogError, match=r"no power figures for GPU 'TPU9'.*MI355X"):
        power.gpu_power("TPU9")


def test_prefill_heavy_points_draw_more_than_decode_heavy_ones_within_the_boards_range() -> None:
    figures = power.gpu_power("MI355X")
    share = power.memory_bound_share()
    memory_floor = figures.idle_w + share * (figures.tdp_w - figures.idle_w)
    prefill = watts(measure(isl=8192, osl=2, conc=16))
    decode = watts(measure(isl=16, osl=256, conc=1))
    # A closed loop keeps the engine busy: at least every step's memory-bound share, at most
    # the rated power; tensor-core time lifts a prefill-heavy point above a decode-heavy one.
    assert memory_floor <= decode < prefill <= figures.tdp_w


def test_an_open_loop_idling_between_requests_draws_closer_to_idle() -> None:
    closed = measure(isl=256, osl=64, conc=4)
    sparse = measure(isl=256, osl=64, conc=4, request_rate=0.5)
    assert power.gpu_power("MI355X").idle_w < watts(sparse) < watts(closed)


def test_energy_is_mean_power_times_gpus_times_duration_and_per_token_from_the_counts() -> None:
    point = bench_point(1024, 128, 8)
    m = handle().run_point(point, LoadSettings(prompts_per_conc=2, warmup_per_conc=1))
    record = build_result(point, m, spec=None, backend="sim")
    assert record["simulated"] is True and record["power_source"] == "simulated"
    assert record["power_valid"] == 1 and record["power_num_gpus"] == point.server.gpus == 4
    energy = watts(m) * 4 * m.duration_s
    assert record["avg_power_w"] == round(watts(m), 3)
    assert record["total_gpu_energy_j"] == pytest.approx(energy, abs=1e-3)
    out, total = record["total_output_tokens"], record["total_input_tokens"]
    lens = record["output_lens"]
    assert isinstance(out, int) and isinstance(total, int) and isinstance(lens, list)
    assert out == sum(lens) > 0  # the point's own token counts
    assert record["joules_per_output_token"] == pytest.approx(energy / out, abs=1e-6)
    assert record["joules_per_total_token"] == pytest.approx(energy / (out + total), abs=1e-6)


def test_a_recipe_run_reports_the_power_in_its_files_junit_and_table(
        pytester: pytest.Pytester) -> None:
    (pytester.path / "bench-master.yaml").write_text(
        master_entry(rows=["{ tp: 4, conc-list: [4] }"], isl=512, osl=64))
    shutil.copytree(REPO / "benchmarks" / "launch", pytester.path / "launch")
    result = pytester.runpytest("-p", "no:cacheprovider", "--inferbench-no-plots",
                                "--inferbench-prompts-per-conc", "2", "--junitxml=junit.xml")
    result.assert_outcomes(passed=1)
    result.stdout.re_match_lines([r"\s*ISL/OSL\s+.*\s+J/out tok\s+.*verdict",
                                  r"\s*512/64\s+4\s+.*\s+[\d.]+\s+passed"])
    points = pytester.path / "inferbench-results" / "points"
    (agg_path,) = points.glob("agg_*.json")
    agg = json.loads(agg_path.read_text())
    raw = json.loads((points / agg_path.name.removeprefix("agg_")).read_text())
    # The agg file: InferenceX's power keys after its own, then the simulated stamp.
    assert list(agg)[-6:] == ["power_valid", "total_gpu_energy_j", "avg_power_w",
                              "joules_per_output_token", "joules_per_total_token", "inferbench"]
    assert agg["inferbench"] == {"simulated": True} and agg["power_valid"] == 1
    energy = agg["avg_power_w"] * 4 * raw["duration"]
    assert agg["total_gpu_energy_j"] == pytest.approx(energy, abs=1e-2)
    assert agg["joules_per_output_token"] == pytest.approx(
        energy / raw["total_output_tokens"], rel=1e-5)
    # The raw file keeps benchmark_serving's keys; the power is under its namespace.
    assert "avg_power_w" not in raw and raw["inferbench"]["avg_power_w"] == agg["avg_power_w"]
    assert raw["inferbench"]["power_source"] == "simulated"
    (case,) = ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
    values = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert values["power_valid"] == "1"
    assert float(values["avg_power_w"] or "nan") == agg["avg_power_w"]
    assert float(values["joules_per_output_token"] or "nan") == agg["joules_per_output_token"]
