"""A framework profile's step overhead is paid per layer a forward runs: it was fitted on the
calibration model, and a shallower or deeper model pays its share. A calibration's own knobs
are fitted for one model and are used as they are."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_inferbench.sim import calibration, catalog
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.efficiency import Efficiency
from pytest_inferbench.sim.engine import Engine

FITTED_LAYERS = catalog.checkpoint(calibration.MODEL).architecture.layers


def engine(model: str, hardware: str = "B200") -> Engine:
    config, _ = engine_config_from_argv(["vllm", "serve", model, "-tp", "8"], hardware=hardware,
                                        env={})
    return Engine(config)


@pytest.mark.parametrize("model", ["openai/gpt-oss-120b", "zai-org/GLM-5-FP8",
                                   "deepseek-ai/DeepSeek-R1-0528"])
def test_profile_overhead_scales_with_the_models_layers(model: str) -> None:
    layers = catalog.checkpoint(model).architecture.layers
    assert layers != FITTED_LAYERS  # each of these is shallower or deeper than the fitted one
    profile = catalog.framework("vllm").step_overhead_s
    assert engine(model).cost.overhead_s == pytest.approx(profile * layers / FITTED_LAYERS)


def test_the_calibration_model_pays_the_overhead_as_fitted() -> None:
    config, _ = engine_config_from_argv(list(calibration.ARGV), hardware=calibration.HARDWARE,
                                        env=dict(calibration.ENV))
    fitted = catalog.framework(calibration.FRAMEWORK).step_overhead_s
    assert Engine(config).cost.overhead_s == pytest.approx(fitted)


def test_a_calibrations_overhead_is_not_rescaled() -> None:
    base = engine("openai/gpt-oss-120b")
    knobs = Efficiency(step_overhead_s=0.02, hbm_efficiency=0.8, compute_efficiency=0.09)
    calibrated = Engine(dataclasses.replace(base.config, efficiency=knobs))
    assert calibrated.cost.overhead_s == knobs.step_overhead_s
