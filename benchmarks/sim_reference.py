"""The simulator against public measurements: prints the reference table of docs/simulator.md.

Each row is one published serving measurement (vendor or framework pages, a public benchmark
sweep), the server argv it states or implies, the load it ran, and the measured value. The
simulator predicts the same metric under the same load; the table shows both and the error.
Nothing here feeds back into the simulator: the errors are what they are.

With `--write PATH` it also writes the expected error of a simulated point per regime (the
median |error| of the reference rows and the calibration table in each, `sim/expected_error.py`)
to PATH; the packaged table is this output, and a test checks that it still is:

    python benchmarks/sim_reference.py
    python benchmarks/sim_reference.py --write pytest_inferbench/sim/expected_error.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from pytest_inferbench.loadgen.workload import LoadSettings, build_workload
from pytest_inferbench.results.metrics import summarize
from pytest_inferbench.sim import calibration, expected_error
from pytest_inferbench.sim.args import engine_config_from_argv
from pytest_inferbench.sim.driver import simulate_point

ATOM_M3 = list(calibration.ARGV)
ATOM_ENV = tuple(calibration.ENV.items())
SGLANG_MTP = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def sglang(model: str, tp: int = 8, *extra: str) -> list[str]:
    return ["python3", "-m", "sglang.launch_server", "--model-path", model, "--tp", str(tp),
            *extra]


def vllm(model: str, tp: int = 8) -> list[str]:
    return ["vllm", "serve", model, "--tensor-parallel-size", str(tp)]


@dataclass(frozen=True)
class Reference:
    label: str
    source: str
    argv: list[str]
    hardware: str
    isl: int
    osl: int
    conc: int
    prompts: int
    metric: str  # a metrics.summarize key
    measured: float
    range_ratio: float = 1.0  # 1.0 = every request exactly isl / osl tokens
    env: tuple[tuple[str, str], ...] = ()


# Sources (every number below is the source's own):
# [atom]   ROCm/ATOM recipes/MiniMax-M3.md (performance-model.md §A8): the calibration set.
# [gist]   github gist BenHamm/78563d0d0a08d7cb61b4737392633384, "SGLang B200 Benchmark Sweep",
#          SGLang v0.5.8.post1, 8 x B200, sglang.bench_serving random 1K in / 1K out, cookbook
#          configs, TP8; TPOT at concurrency 1.
# [lambda] lambda.ai/inference-models/<model> pages, 8 x B200 (HGX), `vllm bench serve` random,
#          the stated input/output lengths, prompts and parallel requests.
REFERENCES = [
    Reference("MiniMax-M3 MXFP4, ATOM, 4xMI355X, conc 4", "atom", ATOM_M3, calibration.HARDWARE,
              calibration.ISL, calibration.OSL, 4, 40, "mean_tpot_ms",
              calibration.MEASURED[4][1], 0.8, ATOM_ENV),
    Reference("MiniMax-M3 MXFP4, ATOM, 4xMI355X, conc 64", "atom", ATOM_M3, calibration.HARDWARE,
              calibration.ISL, calibration.OSL, 64, 640, "output_throughput",
              calibration.MEASURED[64][2], 0.8, ATOM_ENV),
    Reference("gpt-oss-120b, SGLang TP8, B200, conc 1", "gist",
              sglang("openai/gpt-oss-120b"), "B200", 1024, 1024, 1, 10, "mean_tpot_ms", 2.41),
    Reference("DeepSeek-R1-0528 FP4, SGLang TP8, B200, conc 1", "gist",
              sglang("nvidia/DeepSeek-R1-0528-FP4-V2"), "B200", 1024, 1024, 1, 10,
              "mean_tpot_ms", 5.74),
    Reference("GLM-5 FP8, SGLang TP8, B200, conc 1", "gist", sglang("zai-org/GLM-5-FP8"),
              "B200", 1024, 1024, 1, 10, "mean_tpot_ms", 20.22),
    Reference("GLM-5 FP8 + MTP (AL 3.52), SGLang TP8, B200, conc 1", "gist",
              sglang("zai-org/GLM-5-FP8", 8, *SGLANG_MTP), "B200", 1024, 1024, 1, 10,
              "mean_tpot_ms", 7.69, env=(("SGLANG_SIMULATE_ACC_LEN", "3.52"),)),
    Reference("Qwen3.5-397B-A17B BF16, SGLang TP8, B200, conc 32", "lambda",
              sglang("Qwen/Qwen3.5-397B-A17B"), "B200", 8192, 1024, 32, 512,
              "output_throughput", 1232),
    Reference("Qwen3.5-397B-A17B BF16, SGLang TP8, B200, conc 32", "lambda",
              sglang("Qwen/Qwen3.5-397B-A17B"), "B200", 8192, 1024, 32, 512,
              "mean_ttft_ms", 1825),
    Reference("Qwen3.5-397B-A17B BF16, SGLang TP8, B200, conc 32", "lambda",
              sglang("Qwen/Qwen3.5-397B-A17B"), "B200", 8192, 1024, 32, 512,
              "mean_itl_ms", 24),
    Reference("DeepSeek-V4-Pro, vLLM TP8, B200, conc 32", "lambda",
              vllm("deepseek-ai/DeepSeek-V4-Pro"), "B200", 8192, 2048, 32, 512,
              "output_throughput", 855),
    Reference("DeepSeek-V4-Pro, vLLM TP8, B200, conc 32", "lambda",
              vllm("deepseek-ai/DeepSeek-V4-Pro"), "B200", 8192, 2048, 32, 512,
              "mean_ttft_ms", 3656),
    Reference("DeepSeek-V4-Pro, vLLM TP8, B200, conc 32", "lambda",
              vllm("deepseek-ai/DeepSeek-V4-Pro"), "B200", 8192, 2048, 32, 512,
              "mean_itl_ms", 36),
    Reference("Kimi-K2.6 (K2.5 architecture, INT4), vLLM TP8, B200, conc 32", "lambda",
              vllm("moonshotai/Kimi-K2.5"), "B200", 8192, 2048, 32, 512,
              "output_throughput", 1408),
    Reference("Kimi-K2.6 (K2.5 architecture, INT4), vLLM TP8, B200, conc 32", "lambda",
              vllm("moonshotai/Kimi-K2.5"), "B200", 8192, 2048, 32, 512,
              "mean_ttft_ms", 2264),
]


# The calibration table (tests/sim/test_calibration.py), each of its numbers a row: in-sample
# for the calibrated family, the only points there are of it. Its conc 4 TPOT and conc 64
# throughput are the [atom] rows above, counted once.
CALIBRATION_ROWS = [
    Reference(f"MiniMax-M3 MXFP4, ATOM, 4xMI355X, conc {conc}", "atom", ATOM_M3,
              calibration.HARDWARE, calibration.ISL, calibration.OSL, conc, 10 * conc, metric,
              calibration.MEASURED[conc][index], 0.8, ATOM_ENV)
    for conc in sorted(calibration.MEASURED)
    for index, metric in enumerate(("mean_ttft_ms", "mean_tpot_ms", "output_throughput"))]
SOURCE = "docs/simulator.md reference and calibration tables"


def predict(ref: Reference) -> float:
    return _predict(ref)[0]


def _predict(ref: Reference) -> tuple[float, str]:
    """The simulated metric and the row's regime."""
    config, _ = engine_config_from_argv(ref.argv, hardware=ref.hardware, env=dict(ref.env))
    per_conc = max(ref.prompts // ref.conc, 1)
    load = LoadSettings(prompts_per_conc=per_conc, range_ratio=ref.range_ratio)
    point = simulate_point(config, build_workload(ref.isl, ref.osl, ref.conc, load))
    s = summarize(point.records, duration_s=point.duration_s, num_prompts=per_conc * ref.conc,
                  max_concurrency=ref.conc, num_gpus=config.tp)
    return float(s[ref.metric]), expected_error.regime(config, ref.isl, ref.osl, ref.conc)


def error_table() -> dict[str, object]:
    """The expected-error data file's content, computed from the rows."""
    rows = [ref for ref in REFERENCES if ref.source != "atom"] + CALIBRATION_ROWS
    errors: dict[str, dict[str, list[float]]] = {}
    for ref in rows:
        got, regime = _predict(ref)
        metric = expected_error.METRIC_OF_KEY[ref.metric]
        errors.setdefault(regime, {}).setdefault(metric, []).append(abs(got / ref.measured - 1))
    return expected_error.table_json(expected_error.figures(errors), SOURCE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, metavar="PATH",
                        help="also write the expected error per regime (JSON) to PATH")
    args = parser.parse_args(argv)
    print("| point | source | metric | measured | simulated | error |")
    print("|---|---|---|---:|---:|---:|")
    errors = []
    for ref in REFERENCES:
        got = predict(ref)
        err = got / ref.measured - 1.0
        errors.append(abs(err))
        print(f"| {ref.label} ({ref.isl}/{ref.osl}) | [{ref.source}] | {ref.metric} | "
              f"{ref.measured:g} | {got:.4g} | {err:+.0%} |")
    errors.sort()
    print(f"\nmedian |error| {errors[len(errors) // 2]:.0%} over {len(errors)} points")
    if args.write is not None:
        args.write.write_text(json.dumps(error_table(), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
