"""Each gate failing and passing, with the message text asserted."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_inferbench.gates import Gates, evaluate_point, load_gates
from pytest_inferbench.gates.baseline import load_baseline, save_baseline
from pytest_inferbench.gates.rules import GatesFile, GatesFileError, load_gates_file, parse_gates
from pytest_inferbench.recipe.golden import load_golden_al, packaged
from pytest_inferbench.recipe.launch import ClientOptions, packaged_launch_dir

GATES_YAML = """\
slo:
  - match: {config: "minimaxm3-*", isl: 8192, osl: 1024, conc: "1-64"}
    require:
      - p99_ttft <= 2.0
      - tput_per_gpu >= 500
  - match: {config: "other-*"}
    require:
      - p99_ttft <= 0.001
regression:
  tolerance: 5%
  metrics: {p99_ttft: 0.10}
"""

GOLDEN_YAML = """\
minimax-m3:
  thinking_on: {1: 1.78, 2: 2.38, 3: 2.83}
  thinking_off: {1: 1.84, 2: 2.52, 3: 2.93}
"""

EAGLE3 = ("--method", "eagle3", "--num-speculative-tokens", "3")


@pytest.fixture
def recipe_dir(tmp_path: Path) -> Path:
    (tmp_path / "gates.yaml").write_text(GATES_YAML)
    (tmp_path / "golden_al").mkdir()
    (tmp_path / "golden_al" / "minimaxm3_eagle3.yaml").write_text(GOLDEN_YAML)
    (tmp_path / "amd-master.yaml").write_text("{}\n")
    return tmp_path


def gates_for(objs: Any, recipe_dir: Path) -> Gates:
    return load_gates(recipe_dir / "amd-master.yaml", objs.make_settings())


def golden_only(recipe_dir: Path) -> Gates:
    return Gates(golden=load_golden_al(recipe_dir / "golden_al"))


def test_slo_passes_within_thresholds(objs: Any, recipe_dir: Path) -> None:
    point = objs.make_point()
    result = objs.make_result(point, p99_ttft=1.5, tput_per_gpu=800.0)
    assert (
        evaluate_point(result, point, None, objs.make_settings(), gates_for(objs, recipe_dir), None)
        == []
    )


def test_slo_failure_names_value_threshold_and_line(objs: Any, recipe_dir: Path) -> None:
    point = objs.make_point()
    result = objs.make_result(point, p99_ttft=2.31, tput_per_gpu=420.0)
    failures = evaluate_point(
        result, point, None, objs.make_settings(), gates_for(objs, recipe_dir), None
    )
    where = recipe_dir / "gates.yaml"
    assert failures == [
        f"p99_ttft 2.31 s > 2.00 s ({where}:4)",
        f"tput_per_gpu 420.0 tok/s/GPU < 500.0 tok/s/GPU ({where}:5)",
    ]


def test_slo_rule_outside_its_match_does_not_apply(objs: Any, recipe_dir: Path) -> None:
    point = objs.make_point(conc=128)  # the rule covers conc 1-64 only
    result = objs.make_result(point, p99_ttft=9.0, tput_per_gpu=1.0)
    assert (
        evaluate_point(result, point, None, objs.make_settings(), gates_for(objs, recipe_dir), None)
        == []
    )


def test_slo_on_a_missing_result_key_fails_clearly(objs: Any, tmp_path: Path) -> None:
    gates = Gates(parse_gates("slo:\n  - require: [p99_ttft_ms <= 100]\n", tmp_path / "g.yaml"))
    point = objs.make_point()
    failures = evaluate_point(
        objs.make_result(point), point, None, objs.make_settings(), gates, None
    )
    assert failures == [f"p99_ttft_ms: not in the result ({tmp_path / 'g.yaml'}:2)"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "slo:\n  - require: [p99_ttft < 2]\n",
            "g.yaml:2: operator '<' in 'p99_ttft < 2': use '>=' or '<='",
        ),
        ("slo:\n  - match: {conc: 64-8}\n    require: [a >= 1]\n", "g.yaml:2: 'conc' must be N"),
        ("slo:\n  - match: {gpu: x}\n    require: [a >= 1]\n", "g.yaml:2: unknown match key 'gpu'"),
        ("slo:\n  - match: {isl: 1k}\n", "g.yaml:2: 'isl' must be a positive integer"),
        ("regression:\n  tolerance: lots\n", "g.yaml:2: tolerance must be a fraction"),
        ("slo: [\n", "g.yaml:2: invalid YAML"),
        ("slos: []\n", "g.yaml:1: unknown key 'slos'"),
    ],
)
def test_malformed_gates_file_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(text)
    with pytest.raises(GatesFileError) as info:
        load_gates_file(path)
    assert message in str(info.value)


def test_missing_explicit_gates_file_is_an_error(objs: Any, recipe_dir: Path) -> None:
    settings = objs.make_settings(gates_file=recipe_dir / "nope.yaml")
    with pytest.raises(GatesFileError, match=r"nope\.yaml: gates file does not exist"):
        load_gates(recipe_dir / "amd-master.yaml", settings)


def test_failure_ratio_gate(objs: Any, recipe_dir: Path) -> None:
    point = objs.make_point(conc=4)
    result = objs.make_result(point, completed=37, failed=3)
    gates = Gates()
    assert evaluate_point(result, point, None, objs.make_settings(), gates, None) == [
        "3/40 requests failed (7.5% > allowed 0.0%, --inferbench-max-failure-ratio)"
    ]
    # The causes, most frequent first, from the result's error counts.
    result["errors"] = {"HTTP 500: simulated internal server error": 2,
                        "stream ended without [DONE]": 1}
    assert evaluate_point(result, point, None, objs.make_settings(), gates, None) == [
        "3/40 requests failed (7.5% > allowed 0.0%, --inferbench-max-failure-ratio): "
        "2 x HTTP 500: simulated internal server error, 1 x stream ended without [DONE]"
    ]
    assert (
        evaluate_point(result, point, None, objs.make_settings(max_failure_ratio=0.1), gates, None)
        == []
    )


def test_baseline_regression_is_direction_aware(objs: Any, tmp_path: Path) -> None:
    point = objs.make_point()
    before = objs.make_result(point, tput_per_gpu=1000.0, p99_ttft=2.0, median_intvty=50.0)
    save_baseline(tmp_path / "base.json", [before], {"backend": "sim"})
    baseline = load_baseline(tmp_path / "base.json")
    regression_only = "regression:\n  tolerance: 5%\n  metrics: {p99_ttft: 0.10}\n"
    gates = Gates(parse_gates(regression_only, tmp_path / "gates.yaml"))
    settings = objs.make_settings()

    # Better in both directions (more throughput, less latency): passes.
    better = objs.make_result(point, tput_per_gpu=1200.0, p99_ttft=1.0, median_intvty=60.0)
    assert evaluate_point(better, point, None, settings, gates, baseline) == []
    # Throughput down 10% (tolerance 5%) and TTFT up 20% (tolerance 10%): both fail.
    worse = objs.make_result(point, tput_per_gpu=900.0, p99_ttft=2.4, median_intvty=50.0)
    failures = evaluate_point(worse, point, None, settings, gates, baseline)
    source = tmp_path / "base.json"
    assert failures == [
        "tput_per_gpu 900.0 tok/s/GPU < baseline 1000.0 tok/s/GPU "
        f"(-10.0%, tolerance 5%; {source})",
        f"p99_ttft 2.40 s > baseline 2.00 s (+20.0%, tolerance 10%; {source})",
    ]
    # Within tolerance: TTFT up 8% under a 10% tolerance, throughput down 4% under 5%.
    close = objs.make_result(point, tput_per_gpu=960.0, p99_ttft=2.16, median_intvty=50.0)
    assert evaluate_point(close, point, None, settings, gates, baseline) == []


def test_baseline_from_results_directory_matches_by_identity(objs: Any, tmp_path: Path) -> None:
    point4, point64 = objs.make_point(conc=4), objs.make_point(conc=64)
    (tmp_path / "runs").mkdir()
    for p, tput in ((point4, 100.0), (point64, 1000.0)):
        data = objs.make_result(p, tput_per_gpu=tput, image="old-image", backend="docker")
        (tmp_path / "runs" / f"c{p.conc}.json").write_text(json.dumps(data))
    baseline = load_baseline(tmp_path / "runs")
    now = objs.make_result(point64, tput_per_gpu=500.0, image="new-image", backend="sim")
    across = objs.make_settings(baseline_any_setup=True)  # docker then, sim now: asked for
    failures = evaluate_point(now, point64, None, across, Gates(), baseline)
    assert len(failures) == 1
    assert failures[0].startswith(
        "tput_per_gpu 500.0 tok/s/GPU < baseline 1000.0 tok/s/GPU (-50.0%"
    )


def test_spec_decode_without_chat_template_fails(objs: Any, recipe_dir: Path) -> None:
    point = objs.make_point(spec_decoding="mtp")
    result = objs.make_result(point, acceptance_length=2.9)
    spec_chat = objs.make_spec(EAGLE3, chat=True)
    spec_plain = objs.make_spec(EAGLE3, chat=False)
    gates = golden_only(recipe_dir)
    assert evaluate_point(result, point, spec_chat, objs.make_settings(), gates, None) == []
    assert evaluate_point(result, point, spec_plain, objs.make_settings(), gates, None) == [
        "speculative decoding (eagle3) without the chat template: set "
        "client.use-chat-template: true in benchmarks/launch/minimaxm3_fp4_mi355x_atom_mtp.yaml; "
        "AL depends on chat framing"
    ]


def test_spec_decode_behind_the_chat_endpoint_is_chat_framed(objs: Any, recipe_dir: Path) -> None:
    # An agentic replay's client: the chat endpoint, where the server applies the model's chat
    # template (InferenceX's agentic scripts pass no --use-chat-template and need none).
    point = objs.make_point(spec_decoding="mtp")
    result = objs.make_result(point, acceptance_length=2.9)
    spec = replace(objs.make_spec(EAGLE3, chat=False),
                   client=ClientOptions(use_chat_template=False, endpoint="/v1/chat/completions"))
    assert evaluate_point(result, point, spec, objs.make_settings(), golden_only(recipe_dir),
                          None) == []


def test_chat_template_fix_names_the_users_override_not_the_packaged_spec(
    objs: Any, recipe_dir: Path
) -> None:
    point = objs.make_point(spec_decoding="mtp")
    result = objs.make_result(point, acceptance_length=2.9)
    packaged = packaged_launch_dir() / "minimaxm3_fp4_mi355x_atom.yaml"
    local = Path("benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml")
    spec = replace(objs.make_spec(EAGLE3, chat=False), launch_file=packaged, override_file=local)
    (failure,) = evaluate_point(result, point, spec, objs.make_settings(),
                                golden_only(recipe_dir), None)
    assert failure == (
        "speculative decoding (eagle3) without the chat template: set "
        f"client.use-chat-template: true in {local} (a local copy of the packaged "
        "minimaxm3_fp4_mi355x_atom.yaml, which it overrides); AL depends on chat framing"
    )
    assert str(packaged.parent) not in failure
    forced = replace(spec, argv=(*spec.argv, "--spec-decode-acceptance-length", "2.78"))
    far = objs.make_result(point, acceptance_length=2.5)
    assert evaluate_point(far, point, forced, objs.make_settings(), golden_only(recipe_dir),
                          None)[-1] == (
        "acceptance_length 2.50 != forced 2.78 (--spec-decode-acceptance-length, packaged "
        f"minimaxm3_fp4_mi355x_atom.yaml, overridden by {local}): off by 10.1% > 3%"
    )


@pytest.mark.parametrize(
    ("argv", "env", "source"),
    [
        (
            (*EAGLE3, "--spec-decode-acceptance-length", "2.78"),
            (),
            "--spec-decode-acceptance-length",
        ),
        (
            (
                "--speculative-config",
                json.dumps(
                    {
                        "method": "eagle3",
                        "num_speculative_tokens": 3,
                        "rejection_sample_method": "synthetic",
                        "synthetic_acceptance_length": 2.78,
                    }
                ),
            ),
            (),
            "synthetic_acceptance_length in --speculative-config",
        ),
        (
            ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"),
            (("SGLANG_SIMULATE_ACC_LEN", "2.78"),),
            "SGLANG_SIMULATE_ACC_LEN",
        ),
    ],
)
def test_forced_acceptance_length_must_be_met(
    objs: Any,
    recipe_dir: Path,
    argv: tuple[str, ...],
    env: tuple[tuple[str, str], ...],
    source: str,
) -> None:
    point = objs.make_point(spec_decoding="mtp")
    spec = objs.make_spec(argv, env)
    gates = golden_only(recipe_dir)
    near = objs.make_result(point, acceptance_length=2.78 * 1.02)  # 2% off: inside the 3% tolerance
    assert evaluate_point(near, point, spec, objs.make_settings(), gates, None) == []
    far = objs.make_result(point, acceptance_length=2.5)
    assert evaluate_point(far, point, spec, objs.make_settings(), gates, None) == [
        f"acceptance_length 2.50 != forced 2.78 ({source}, "
        "benchmarks/launch/minimaxm3_fp4_mi355x_atom_mtp.yaml): off by 10.1% > 3%"
    ]


def test_golden_al_delta_rule(objs: Any, tmp_path: Path, recipe_dir: Path) -> None:
    rules = parse_gates(
        "slo:\n  - require:\n      - golden_al_delta <= 0.2\n", tmp_path / "al.yaml"
    )
    gates = Gates(rules, load_golden_al(recipe_dir / "golden_al"))
    point = objs.make_point(spec_decoding="mtp")
    spec = objs.make_spec(EAGLE3)  # k=3, thinking on: golden 2.83
    assert (
        evaluate_point(
            objs.make_result(point, acceptance_length=2.9),
            point,
            spec,
            objs.make_settings(),
            gates,
            None,
        )
        == []
    )
    assert evaluate_point(
        objs.make_result(point, acceptance_length=3.2),
        point,
        spec,
        objs.make_settings(),
        gates,
        None,
    ) == [f"golden_al_delta 0.37 > 0.20 ({tmp_path / 'al.yaml'}:3)"]
    thinking_off = objs.make_spec(
        (*EAGLE3, "--default-chat-template-kwargs", '{"enable_thinking": false}')
    )
    # Thinking off: golden 2.93, so 3.2 is 0.27 away and still fails, 3.1 passes.
    assert (
        evaluate_point(
            objs.make_result(point, acceptance_length=3.1),
            point,
            thinking_off,
            objs.make_settings(),
            gates,
            None,
        )
        == []
    )


def test_ngram_without_chat_template_passes_and_is_recorded_as_ngram(
        objs: Any, recipe_dir: Path) -> None:
    from pytest_inferbench.gates import acceptance_fields

    # Prompt lookup drafts from the prompt's text: no trained head whose acceptance the chat
    # framing decides, so raw prompts are no gate failure.
    config = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    point = objs.make_point(spec_decoding="mtp")
    spec = objs.make_spec(("--speculative-config", json.dumps(config)), chat=False)
    result = objs.make_result(point, acceptance_length=1.4)
    gates = golden_only(recipe_dir)
    assert evaluate_point(result, point, spec, objs.make_settings(), gates, None) == []
    fields = acceptance_fields(point, spec, gates)
    assert fields["spec_method"] == "ngram" and fields["spec_num_tokens"] == 3
    assert fields["golden_acceptance_length"] is None  # no golden curve for prompt lookup


def test_acceptance_fields_record_golden_next_to_measured(objs: Any, recipe_dir: Path) -> None:
    from pytest_inferbench.gates import acceptance_fields

    point = objs.make_point(spec_decoding="mtp")
    fields = acceptance_fields(point, objs.make_spec(EAGLE3), golden_only(recipe_dir))
    assert fields["golden_acceptance_length"] == 2.83
    assert fields["spec_method"] == "eagle3" and fields["spec_num_tokens"] == 3
    assert fields["thinking_mode"] == "thinking_on"
    assert acceptance_fields(objs.make_point(), objs.make_spec(), golden_only(recipe_dir)) == {}


def test_empty_gates_file_is_allowed(tmp_path: Path) -> None:
    assert parse_gates("", tmp_path / "g.yaml") == GatesFile(tmp_path / "g.yaml")


def test_repository_gates_and_golden_files_load() -> None:
    repo = Path(__file__).resolve().parents[2] / "benchmarks"
    gates = load_gates_file(repo / "gates.yaml")
    assert gates.rules and gates.regression.default_tolerance == 0.05
    golden = packaged()
    # InferenceX golden_al_distribution/minimaxm3_eagle3.yaml, k=3 (performance-model.md §A7).
    assert golden.lookup("minimaxm3", "eagle3", "thinking_on", 3) == 2.83
    assert golden.lookup("minimaxm3", "eagle3", "thinking_off", 3) == 2.93


def test_baseline_of_another_setup_is_refused_unless_asked(objs: Any, tmp_path: Path) -> None:
    point = objs.make_point()
    workload = {"dataset": "random", "seed": 0, "request_rate": "inf", "prompts_per_conc": 10}
    before = objs.make_result(point, tput_per_gpu=1000.0, backend="sim", time_scale=None,
                              workload=workload)
    save_baseline(tmp_path / "base.json", [before], {})
    baseline = load_baseline(tmp_path / "base.json")
    now = objs.make_result(point, tput_per_gpu=1000.0, backend="sim-server", time_scale=1.0,
                           workload={**workload, "seed": 3})
    (failure,) = evaluate_point(now, point, None, objs.make_settings(), Gates(), baseline)
    assert failure == (
        "baseline not comparable: measured otherwise (backend 'sim' -> 'sim-server'; "
        "time_scale None -> 1.0; client seed 0 -> 3; "
        f"{tmp_path / 'base.json'}); --inferbench-baseline-any-setup compares anyway")
    across = objs.make_settings(baseline_any_setup=True)
    assert evaluate_point(now, point, None, across, Gates(), baseline) == []
    # The same setup compares as before.
    same = objs.make_result(point, tput_per_gpu=900.0, backend="sim", time_scale=None,
                            workload=workload)
    (regressed,) = evaluate_point(same, point, None, objs.make_settings(), Gates(), baseline)
    assert regressed.startswith("tput_per_gpu 900.0 tok/s/GPU < baseline 1000.0")


def test_timing_gates_refuse_timings_that_are_not_meaningful(
        objs: Any, recipe_dir: Path, tmp_path: Path) -> None:
    point = objs.make_point()
    fast = {"backend": "sim-server", "time_scale": 0.0, "timings_meaningful": False}
    result = objs.make_result(point, p99_ttft=0.01, tput_per_gpu=9000.0, **fast)
    where = recipe_dir / "gates.yaml"
    refused = ("not judged: timings not meaningful (time scale 0.0: the simulated server "
               "streamed as fast as it could)")
    assert evaluate_point(result, point, None, objs.make_settings(),
                          gates_for(objs, recipe_dir), None) == [
        f"p99_ttft: {refused} ({where}:4)", f"tput_per_gpu: {refused} ({where}:5)"]
    # Against a baseline of the same setup only the untimed metrics compare.
    before = objs.make_result(point, p99_ttft=0.02, tput_per_gpu=100.0, acceptance_length=3.0,
                              **fast)
    save_baseline(tmp_path / "base.json", [before], {})
    now = {**result, "acceptance_length": 2.0}
    failures = evaluate_point(now, point, None, objs.make_settings(), Gates(),
                              load_baseline(tmp_path / "base.json"))
    assert failures[0].startswith("baseline: timing metrics not compared: timings not meaningful")
    assert [f.split(" ")[0] for f in failures[1:]] == ["acceptance_length"]
