"""Calibration: ATOM MiniMax-M3 MXFP4 on 4 x MI355X, TP4, ISL 8192 / OSL 1024, no speculation.

The measured table and the server argv are `pytest_inferbench.sim.calibration`'s (with their
source). Acceptance: mean TPOT within 10%, mean TTFT within 25%, output throughput within 10%.
"""

from __future__ import annotations

import pytest

from pytest_inferbench.loadgen.workload import LoadSettings, build_workload
from pytest_inferbench.results.metrics import summarize
from pytest_inferbench.sim import calibration
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.driver import simulate_point

MEASURED = calibration.MEASURED


@pytest.mark.parametrize("conc", sorted(MEASURED))
def test_atom_minimax_m3_mxfp4_tp4_mi355x_8k1k(conc: int) -> None:
    config, _ = engine_config_from_argv(list(calibration.ARGV), hardware=calibration.HARDWARE,
                                        env=calibration.ENV)
    assert config.online_quant == "fp8"
    workload = build_workload(calibration.ISL, calibration.OSL, conc, LoadSettings())
    point = simulate_point(config, workload)
    s = summarize(point.records, duration_s=point.duration_s, num_prompts=10 * conc,
                  max_concurrency=conc, num_gpus=calibration.NUM_GPUS)
    ttft, tpot, throughput = MEASURED[conc]
    got = (s["mean_ttft_ms"], s["mean_tpot_ms"], s["output_throughput"])
    report = f"conc {conc}: predicted TTFT/TPOT/tput {got}, measured {MEASURED[conc]}"
    assert s["completed"] == 10 * conc, report
    assert s["mean_tpot_ms"] == pytest.approx(tpot, rel=0.10), report
    assert s["mean_ttft_ms"] == pytest.approx(ttft, rel=0.25), report
    assert s["output_throughput"] == pytest.approx(throughput, rel=0.10), report
