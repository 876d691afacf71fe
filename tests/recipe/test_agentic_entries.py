"""Agentic-coding entries: server nodes with one item per concurrency, InferenceX's rules with
file:line errors, exp names and DRAM budgets from runners.yaml, markers, explicit skips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_inferbench.recipe.schema import RecipeError, load_recipe

AGENTIC = """\
qwen3.5-fp8-b200-sglang-agentic-mtp:
  image: lmsysorg/sglang:v0.5.16-cu130
  model: Qwen/Qwen3.5-397B-A17B-FP8
  model-prefix: qwen3.5
  runner: cluster:b200-dgxc
  precision: fp8
  framework: sglang
  multinode: false
  scenarios:
    agentic-coding:
    - dram-utilization: 0.80
      search-space:
      - { tp: 8, spec-decoding: mtp, kv-offloading: none, conc-list: [4, 8] }
      - { tp: 4, spec-decoding: mtp, kv-offloading: dram, kv-offload-backend: { name: hicache },
          conc-list: [16] }
dsv4-fp4-gb300-dynamo-trt-agentx:
  image: nvcr.io/dynamo:1
  model: deepseek-ai/DeepSeek-V4-Pro
  model-prefix: dsv4
  runner: cluster:gb300-nv
  precision: fp4
  framework: dynamo-trt
  multinode: true
  disagg: true
  kv-p2p-transfer: nixl
  scenarios:
    agentic-coding:
    - dram-utilization: 0.5
      search-space:
      - conc-list: [4]
        kv-offloading: dram
        kv-offload-backend: { name: native, version: 1.3.0rc22.post1 }
        prefill: { num-worker: 1, tp: 4, ep: 4, dp-attn: true }
        decode: { num-worker: 4, tp: 8, ep: 8, dp-attn: true }
"""
# The hardware rows of the two runners, in runners.yaml's form (values of InferenceX's file).
RUNNERS = """\
hardware:
  cluster:b200-dgxc: { available-cpu-dram-mib: 3_095_781, gpus-per-node: 8 }
  cluster:gb300-nv: { available-cpu-dram-mib: 860_160, gpus-per-node: 4 }
"""
MIB, GB = 1024 * 1024, 10**9


def write(directory: Path, text: str = AGENTIC, runners: str | None = RUNNERS) -> Path:
    path = directory / "nvidia-master.yaml"
    path.write_text(text, encoding="utf-8")
    if runners is not None:
        (directory / "runners.yaml").write_text(runners, encoding="utf-8")
    return path


def test_points_carry_exp_names_and_dram_budgets(tmp_path: Path) -> None:
    servers = load_recipe(write(tmp_path)).servers
    points = {p.exp_name: p for s in servers for p in s.points()}
    assert sorted(points) == [
        "dsv4_p1x4_d4x8_conc4_kvdram-native",
        "qwen3.5_tp4_conc16_kvdram-hicache_spec-mtp",
        "qwen3.5_tp8_conc4_kvnone_spec-mtp",
        "qwen3.5_tp8_conc8_kvnone_spec-mtp",
    ]
    budget = {p.exp_name: p.server.total_cpu_dram_gb for p in points.values()}
    # Single node: the capped node DRAM x utilization x tp/gpus-per-node; multinode: the
    # prefill replica's share of its node (4 of 4 GB300 GPUs).
    assert budget["qwen3.5_tp4_conc16_kvdram-hicache_spec-mtp"] == int(
        2_861_022 * MIB * 0.8 * 4 / 8 / GB)
    assert budget["dsv4_p1x4_d4x8_conc4_kvdram-native"] == int(860_160 * MIB * 0.5 / GB)
    assert budget["qwen3.5_tp8_conc4_kvnone_spec-mtp"] == 0


def test_without_runners_yaml_the_dram_budget_is_unknown(tmp_path: Path) -> None:
    servers = load_recipe(write(tmp_path, runners=None)).servers
    assert {s.offloading: s.total_cpu_dram_gb for s in servers} == {"none": 0, "dram": None}


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("  runner: cluster:b200-dgxc\n", "  runner: b200-dgxc\n",
         "L5: qwen3.5-fp8-b200-sglang-agentic-mtp.runner: got 'b200-dgxc' for an entry with "
         "agentic-coding scenarios (expected a 'cluster:<name>' runner"),
        ("tp: 8, spec-decoding: mtp, kv-offloading: none,", "tp: 8, spec-decoding: mtp,",
         "L13: qwen3.5-fp8-b200-sglang-agentic-mtp.scenarios.agentic-coding[0].search-space[0]:"
         " missing required key kv-offloading"),
        ("kv-offloading: none, conc", "kv-offloading: none, kv-offload-backend: {name: x}, conc",
         "search-space[0].kv-offload-backend: given with kv-offloading 'none'"),
        ("kv-offloading: dram, kv-offload-backend: { name: hicache },",
         "kv-offloading: dram,",
         "L14: qwen3.5-fp8-b200-sglang-agentic-mtp.scenarios.agentic-coding[0].search-space[1]"
         ".kv-offloading: dram offloading without kv-offload-backend"),
        ("version: 1.3.0rc22.post1", "version: 'image:nvcr.io/x'",
         "search-space[0].kv-offload-backend.version: an image reference"),
        ("      - conc-list: [4]\n", "      - conc-list: [4]\n        pp: 2\n",
         "L31: dsv4-fp4-gb300-dynamo-trt-agentx.scenarios.agentic-coding[0].search-space[0].pp: "
         "not valid on a multinode agentic row"),
        ("prefill: { num-worker: 1, tp: 4,", "prefill: { num-worker: 1, tp: 3,",
         "L16: dsv4-fp4-gb300-dynamo-trt-agentx: prefill worker tp*pp*pcp-size=3 does not "
         "divide gpus-per-node=4 evenly"),
        ("  kv-p2p-transfer: nixl\n", "",
         "L24: dsv4-fp4-gb300-dynamo-trt-agentx.disagg: disaggregated without kv-p2p-transfer"),
        ("prefill: { num-worker: 1,", "prefill: { hardware: gb300, num-worker: 1,",
         "L30: dsv4-fp4-gb300-dynamo-trt-agentx.scenarios.agentic-coding[0].search-space[0]: "
         "hardware given on one worker pool only"),
        ("  cluster:gb300-nv: { available-cpu-dram-mib: 860_160, gpus-per-node: 4 }\n", "",
         "L16: dsv4-fp4-gb300-dynamo-trt-agentx.runner: no hardware row for 'cluster:gb300-nv'"),
        (RUNNERS, "hardware: [1, 2]\n",
         "L16: dsv4-fp4-gb300-dynamo-trt-agentx.runner: no 'hardware:' mapping of runner labels "
         "in "),
    ],
)
def test_invalid_agentic_entries_say_file_and_line(tmp_path: Path, old: str, new: str,
                                                   expected: str) -> None:
    text, runners = AGENTIC, RUNNERS
    if old in text:
        text = text.replace(old, new)
    else:
        assert old in runners
        runners = runners.replace(old, new)
    path = write(tmp_path, text, runners)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    messages = [m.replace(f"{path}:", "L") for m in info.value.messages]
    assert any(expected in m for m in messages), messages
    # Problems stay with their entry: an entry the change leaves valid still collects.
    recipe = load_recipe(path, strict=False)
    invalid = {e.config_key for e in recipe.invalid_entries}
    assert any(m.split(": ")[1].startswith(tuple(invalid)) for m in messages)
    assert invalid.isdisjoint(s.config_key for s in recipe.servers)
    assert invalid | {s.config_key for s in recipe.servers} == {
        "qwen3.5-fp8-b200-sglang-agentic-mtp", "dsv4-fp4-gb300-dynamo-trt-agentx"}


def test_items_per_concurrency_select_by_marker_and_replay_in_process(
    pytester: pytest.Pytester,
) -> None:
    write(pytester.path)
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider",
                                "-m", "inferbench(kv_offloading='dram')")
    assert sorted(line for line in result.outlines if "::" in line) == [
        "nvidia-master.yaml::dsv4-fp4-gb300-dynamo-trt-agentx-p1x4ep4dpa-d4x8ep8dpa-agentic"
        "-offload-dram-native::agentic-conc4",
        "nvidia-master.yaml::qwen3.5-fp8-b200-sglang-agentic-mtp-tp4-offload-dram-hicache"
        "::agentic-conc16",
    ]
    # Both replay in process: the single-node point on one engine with its CPU-DRAM tier, the
    # multinode one on its deployment's instances behind the router (`sim/cluster_replay.py`).
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider", "--inferbench-no-plots",
                                "--inferbench-replay-duration=60",
                                "-m", "inferbench(kv_offloading='dram')")
    result.assert_outcomes(passed=2)
    assert "SKIPPED" not in result.stdout.str()
    # TensorRT-LLM's native offload has no launch flags in its registry entry: the multinode
    # point runs without a CPU-DRAM tier and its notes say so.
    points = pytester.path / "inferbench-results" / "points"
    notes = [note for path in points.glob("*p1x4*.json") if not path.name.startswith("agg_")
             for note in json.loads(path.read_text(encoding="utf-8"))["inferbench"]["notes"]]
    assert any("kv-offloading dram (no CPU-DRAM tier simulated): kv-offload-backend 'native'"
               in note for note in notes), notes


CONTEXTS = """\
kimik2.5-fp4-mi355x-vllm:
  image: vllm/vllm-openai-rocm:v0.22.0
  model: amd/Kimi-K2.5-MXFP4
  model-prefix: kimik2.5
  runner: mi355x
  precision: fp4
  framework: vllm
  multinode: false
  scenarios:
    fixed-seq-len:
    - { isl: 8192, osl: 1024, search-space: [{ tp: 8, conc-list: [4] }] }
kimik2.5-fp4-mi355x-vllm-agentic:
  image: vllm/vllm-openai-rocm:v0.22.0
  model: amd/Kimi-K2.5-MXFP4
  model-prefix: kimik2.5
  runner: cluster:mi355x-amds
  precision: fp4
  framework: vllm
  multinode: false
  scenarios:
    agentic-coding:
    - search-space: [{ tp: 8, kv-offloading: none, conc-list: [4] }]
minimaxm3-fp8-mi300x-vllm-agentic:
  image: vllm/vllm-openai-rocm:v0.22.0
  model: MiniMaxAI/MiniMax-M3-MXFP8
  model-prefix: minimaxm3
  runner: cluster:mi300x-amds
  precision: fp8
  framework: vllm
  multinode: false
  scenarios:
    agentic-coding:
    - search-space: [{ tp: 8, kv-offloading: none, conc-list: [4] }]
"""


def test_an_agentic_server_is_launched_at_the_models_native_context(tmp_path: Path) -> None:
    # The packaged vLLM specs pass `--max-model-len {max_model_len}`: a fixed-seq-len node is
    # sized for its longest ISL+OSL; an agentic node (no ISL/OSL) passes no context at all, as
    # InferenceX's agentic scripts do, so the engine serves the model's native context.
    from pytest_inferbench.recipe.launch import packaged_launch_dir, resolve
    from pytest_inferbench.recipe.model import max_model_len

    path = tmp_path / "amd-master.yaml"
    path.write_text(CONTEXTS, encoding="utf-8")
    contexts: dict[str, int | None] = {}
    for server in load_recipe(path).servers:
        argv = resolve(server, packaged_launch_dir()).argv
        contexts[server.config_key] = (int(argv[argv.index("--max-model-len") + 1])
                                       if "--max-model-len" in argv else None)
    assert contexts == {"kimik2.5-fp4-mi355x-vllm": max_model_len(8192, 1024),
                        "kimik2.5-fp4-mi355x-vllm-agentic": None,
                        "minimaxm3-fp8-mi300x-vllm-agentic": None}
