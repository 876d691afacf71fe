"""Speculative decoding is read from the launch argv once; the simulator and the gates agree."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_inferbench.frameworks.specdecode import SpecDecodeArgvError, read_speculative_decoding
from pytest_inferbench.gates.speculative import speculative_decoding
from pytest_inferbench.recipe.golden import (
    GoldenAL,
    GoldenALError,
    load_golden_al,
    model_key,
    packaged,
)
from pytest_inferbench.recipe.launch import resolve
from pytest_inferbench.recipe.model import ServerConfig
from pytest_inferbench.recipe.schema import load_recipe
from pytest_inferbench.sim.args import ArgvError, engine_config_from_argv
from pytest_inferbench.sim.engine import Engine

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
LAUNCH_DIR = BENCHMARKS / "launch"


def shipped_servers() -> list[ServerConfig]:
    """Every server of the shipped master files, each also with `spec-decoding: mtp`, so every
    shipped launch spec is read with and without its speculative overlay."""
    servers: dict[str, ServerConfig] = {}
    for master in sorted(BENCHMARKS.glob("*-master.yaml")):
        for server in load_recipe(master).servers:
            if server.skip_reason is None:
                for variant in (server, dataclasses.replace(server, spec_decoding="mtp")):
                    servers.setdefault(variant.node_name, variant)
    return list(servers.values())


SERVERS = shipped_servers()


def test_every_shipped_launch_spec_is_covered() -> None:
    used = {server.launch_spec_name for server in SERVERS}
    assert used == {path.stem for path in LAUNCH_DIR.glob("*.yaml")}


@pytest.mark.parametrize("server", SERVERS, ids=[s.node_name for s in SERVERS])
def test_simulator_and_gates_read_the_same_speculative_decoding(server: ServerConfig) -> None:
    spec = resolve(server, LAUNCH_DIR)
    gate = speculative_decoding(server, spec)
    config = engine_config_from_argv(spec.argv, hardware=spec.hardware, env=spec.env_dict)[0]
    sim = config.spec
    if not server.speculative:
        assert gate is None and sim is None
        return
    assert gate is not None and sim is not None
    assert (sim.method, sim.num_speculative_tokens, sim.draft_model, sim.thinking) == (
        gate.method, gate.num_tokens, gate.draft_model, gate.thinking)
    assert sim.acceptance_length == gate.acceptance_length
    # The engine aims at the golden AL the gates compare the measurement with.
    golden = packaged().lookup(server.model_prefix, gate.method, gate.thinking_mode,
                               gate.num_tokens)
    assert golden is not None
    probs = Engine(config).accepted_distribution
    assert 1 + sum(i * p for i, p in enumerate(probs)) == pytest.approx(golden)


ATOM = ["python3", "-m", "atom.entrypoints.openai_server", "--model", "amd/MiniMax-M3-MXFP4"]


def test_each_framework_spelling() -> None:
    atom = read_speculative_decoding([*ATOM, "--method", "eagle3", "--draft_model", "D",
                                      "--num-speculative-tokens=3",
                                      "--spec-decode-acceptance-rate", "0.5"])
    assert atom is not None
    assert (atom.method, atom.num_tokens, atom.draft_model) == ("eagle3", 3, "D")
    assert atom.forced_acceptance_length == 2.5
    assert atom.forced_by == "--spec-decode-acceptance-rate"

    config = {"method": "EAGLE3", "model": "D", "num_speculative_tokens": 2,
              "rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.2}
    vllm = read_speculative_decoding(["vllm", "serve", "M", "--speculative-config",
                                      json.dumps(config)])
    assert vllm is not None
    assert (vllm.method, vllm.num_tokens, vllm.forced_acceptance_length) == ("eagle3", 2, 2.2)

    # SGLang chain drafting: --speculative-num-draft-tokens counts the verified token too.
    sglang = read_speculative_decoding(
        ["python", "-m", "sglang.launch_server", "--speculative-algorithm", "NEXTN",
         "--speculative-num-draft-tokens", "4"], {"SGLANG_SIMULATE_ACC_LEN": "2.7"})
    assert sglang is not None
    assert (sglang.method, sglang.num_tokens, sglang.draft_model) == ("nextn", 3, None)
    assert (sglang.forced_acceptance_length, sglang.forced_by) == (2.7, "SGLANG_SIMULATE_ACC_LEN")

    trt = read_speculative_decoding([*ATOM, "--method", "mtp", "--num-speculative-tokens", "3"],
                                    {"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS": "2"})
    assert trt is not None and trt.forced_acceptance_length == 3.0

    assert read_speculative_decoding(ATOM) is None


@pytest.mark.parametrize("config", [
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4},
    # vLLM reads these as ngram too: a prompt_lookup_* key, or the [ngram] model.
    {"num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
    {"model": "[ngram]", "num_speculative_tokens": 3},
])
def test_vllm_ngram_is_its_own_method_that_needs_no_chat_template(
        config: dict[str, object]) -> None:
    argv = ["vllm", "serve", "M", "--speculative-config", json.dumps(config)]
    ngram = read_speculative_decoding(argv)
    assert ngram is not None
    assert (ngram.method, ngram.num_tokens, ngram.draft_model) == ("ngram", 3, None)
    assert not ngram.needs_chat_template
    # A recipe that calls it `spec-decoding: mtp` (InferenceX's only speculative value in
    # use) gets the method the server runs, not the recipe's word.
    server = dataclasses.replace(shipped_servers()[0], spec_decoding="mtp")
    spec = dataclasses.replace(resolve(server, LAUNCH_DIR), argv=tuple(argv))
    described = speculative_decoding(server, spec)
    assert described is not None and described.method == "ngram"
    eagle = read_speculative_decoding([*ATOM, "--method", "eagle3", "--num-speculative-tokens",
                                       "3"])
    assert eagle is not None and eagle.needs_chat_template


def test_thinking_is_on_unless_the_chat_template_kwargs_turn_it_off() -> None:
    eagle = [*ATOM, "--method", "eagle3", "--num-speculative-tokens", "3"]
    on = read_speculative_decoding(eagle)
    off = read_speculative_decoding(
        [*eagle, "--default-chat-template-kwargs", '{"enable_thinking": false}'])
    assert on is not None and off is not None
    assert (on.thinking_mode, off.thinking_mode) == ("thinking_on", "thinking_off")
    config = engine_config_from_argv(
        [*eagle, "--default-chat-template-kwargs", '{"enable_thinking": false}'],
        hardware="MI355X")
    assert config[0].spec is not None and not config[0].spec.thinking
    assert config[1] == []  # the kwargs flag is read, not reported as ignored


def test_unreadable_values_name_the_flag() -> None:
    with pytest.raises(SpecDecodeArgvError, match="--speculative-config is not JSON"):
        read_speculative_decoding(["vllm", "serve", "M", "--speculative-config", "{method"])
    with pytest.raises(SpecDecodeArgvError, match="--num-speculative-tokens: 'three'"):
        read_speculative_decoding([*ATOM, "--method", "eagle3", "--num-speculative-tokens",
                                   "three"])
    with pytest.raises(ArgvError, match="needs the number of speculative tokens"):
        engine_config_from_argv([*ATOM, "--method", "eagle3"], hardware="MI355X")
    # vLLM refuses the synthetic knobs under real verification (InferenceX's accuracy runs
    # switch to "block"), so a launch spec the real server would refuse is refused here too.
    for method in ({}, {"rejection_sample_method": "block"}):
        real = {"method": "mtp", "num_speculative_tokens": 3, **method,
                "synthetic_acceptance_length": 2.49}
        with pytest.raises(SpecDecodeArgvError, match="needs \"rejection_sample_method\""):
            read_speculative_decoding(["vllm", "serve", "M", "--speculative-config",
                                       json.dumps(real)])


def test_packaged_golden_table() -> None:
    golden = packaged()
    # InferenceX golden_al_distribution/minimaxm3_eagle3.yaml, k=3 (performance-model.md §A7).
    assert golden.lookup("minimaxm3", "eagle3", "thinking_on", 3) == 2.83
    assert golden.lookup("MiniMax-M3", "EAGLE3", "thinking_off", 3) == 2.93
    assert model_key("minimax-m3") == model_key("MiniMax-M3") == "minimaxm3"
    with pytest.raises(GoldenALError, match="known k: 1, 2, 3, 4, 5, 6, 7, 8"):
        golden.require("MiniMax-M3", "eagle3", "thinking_on", 12)
    with pytest.raises(GoldenALError, match=r"minimaxm3_nextn\.yaml"):
        golden.require("MiniMax-M3", "nextn", "thinking_on", 3)


def test_a_project_golden_file_replaces_the_packaged_one(tmp_path: Path) -> None:
    (tmp_path / "minimaxm3_eagle3.yaml").write_text("minimax-m3:\n  thinking_on: {3: 2.5}\n")
    merged = packaged().merged(load_golden_al(tmp_path))
    assert merged.lookup("minimaxm3", "eagle3", "thinking_on", 3) == 2.5
    assert merged.lookup("minimaxm3", "eagle3", "thinking_off", 3) is None
    assert GoldenAL().merged(merged) == merged
