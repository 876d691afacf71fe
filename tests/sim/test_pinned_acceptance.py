"""Pinned (synthetic) acceptance: each framework's knob, spelled as InferenceX's throughput
scripts spell it, makes a simulated point's mean acceptance length the pinned one.

The values are the ones InferenceX pins (DeepSeek-V4 2.49 in its vLLM and SGLang recipes,
Qwen3.5 3.39 in SGLang's, 2.78 with TensorRT-LLM's off-by-one knob); none is the golden AL of
the engine's draft, so a point that fell back to the golden curve would miss them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_inferbench.loadgen.workload import LoadSettings, build_workload
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.driver import simulate_point
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]
MODEL = "amd/MiniMax-M3-MXFP4"
DRAFT = "Inferact/MiniMax-M3-EAGLE3"
K = 3

# framework -> (pinned AL, argv, env, files): the launch spec as the real server reads it.
Launch = tuple[float, list[str], dict[str, str], dict[str, str]]
PINNED: dict[str, Launch] = {
    "atom": (2.49, ["python3", "-m", "atom.entrypoints.openai_server", "--model", MODEL,
                    "-tp", "4", "--method", "eagle3", "--draft-model", DRAFT,
                    "--num-speculative-tokens", str(K),
                    "--spec-decode-acceptance-length", "2.49"], {}, {}),
    "vllm": (2.49, ["vllm", "serve", MODEL, "--tensor-parallel-size", "4",
                    "--speculative-config", json.dumps({
                        "method": "eagle3", "model": DRAFT, "num_speculative_tokens": K,
                        "rejection_sample_method": "synthetic",
                        "synthetic_acceptance_length": 2.49})], {}, {}),
    "sglang": (3.39, ["python3", "-m", "sglang.launch_server", "--model-path", MODEL,
                      "--tp", "4", "--speculative-algorithm", "EAGLE3",
                      "--speculative-draft-model-path", DRAFT,
                      "--speculative-num-steps", str(K)],
               {"SGLANG_SIMULATE_ACC_LEN": "3.39"}, {}),
    "trt": (2.78, ["trtllm-serve", MODEL, "--tp_size", "4", "--config", "spec.yml"],
            {"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS": "1.78"},
            {"spec.yml": "speculative_config:\n  decoding_type: Eagle3\n"
                         f"  max_draft_len: {K}\n  speculative_model_dir: {DRAFT}\n"}),
}


@pytest.mark.parametrize("framework", sorted(PINNED))
@pytest.mark.parametrize(("isl", "osl", "conc"), [(512, 64, 4), (1024, 256, 16)])
def test_a_pinned_acceptance_length_is_the_points_mean(framework: str, isl: int, osl: int,
                                                       conc: int) -> None:
    pinned, argv, env, files = PINNED[framework]
    config, _ = engine_config_from_argv(argv, hardware="MI355X", env=env, files=files)
    assert config.framework == framework
    assert config.spec is not None and config.spec.num_speculative_tokens == K
    point = simulate_point(config, build_workload(isl, osl, conc, LoadSettings()))
    measured = point.server_metrics["acceptance_length"]
    assert isinstance(measured, float)
    assert measured == pytest.approx(pinned, rel=0.01), framework


def test_a_pinned_acceptance_length_in_a_plugin_run(pytester: pytest.Pytester) -> None:
    """vLLM's knob in the launch spec's mtp overlay, one point on the `sim` backend."""
    entry = master_entry("minimaxm3-fp4-mi355x-vllm-mtp",
                         ["{ tp: 4, spec-decoding: mtp, conc-start: 8, conc-end: 8 }"],
                         isl=512, osl=128, framework="vllm", image="vllm/vllm-openai:test")
    (pytester.path / "bench-master.yaml").write_text(entry)
    (pytester.path / "launch").mkdir()
    launch = (REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_vllm.yaml").read_text()
    natural = '"num_speculative_tokens": 3}'
    assert natural in launch
    (pytester.path / "launch/minimaxm3_fp4_mi355x_vllm.yaml").write_text(launch.replace(
        natural, '"num_speculative_tokens": 3, "rejection_sample_method": "synthetic", '
                 '"synthetic_acceptance_length": 2.49}'))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    summary = json.loads((pytester.path / "inferbench-results/summary.json").read_text())
    (point,) = summary["points"]
    assert point["synthetic_acceptance_length"] == 2.49
    assert point["acceptance_length"] == pytest.approx(2.49, rel=0.01)
    assert point["golden_acceptance_length"] != pytest.approx(2.49, rel=0.01)
