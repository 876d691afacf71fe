"""The collection tree seen through real pytest runs: ids, markers, -k/-m, skips."""

from __future__ import annotations

import pytest

from pytest_inferbench.recipe.model import settings_digest

ROWS_SPEC_PAIR = [
    "{ tp: 4, conc-list: [1, 2] }",
    "{ tp: 4, spec-decoding: mtp, conc-list: [1, 2] }",
]


def collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    result = pytester.runpytest("--collect-only", "-q", *args)
    return [line for line in result.outlines if "::" in line]


def test_node_ids_and_tree(pytester: pytest.Pytester, write_master, master_entry) -> None:  # type: ignore[no-untyped-def]
    write_master(master_entry("minimaxm3-fp4-mi355x-atom", ROWS_SPEC_PAIR))
    ids = collected(pytester)
    assert ids == [
        "amd-master.yaml::minimaxm3-fp4-mi355x-atom-tp4::isl1024-osl1024-conc1",
        "amd-master.yaml::minimaxm3-fp4-mi355x-atom-tp4::isl1024-osl1024-conc2",
        # Rows differing only in spec-decoding are two servers; -mtp marks the second.
        "amd-master.yaml::minimaxm3-fp4-mi355x-atom-tp4-mtp::isl1024-osl1024-conc1",
        "amd-master.yaml::minimaxm3-fp4-mi355x-atom-tp4-mtp::isl1024-osl1024-conc2",
    ]
    tree = pytester.runpytest("--collect-only").stdout.str()
    assert "<ServerNode minimaxm3-fp4-mi355x-atom-tp4>" in tree
    assert "<BenchItem isl1024-osl1024-conc1>" in tree


def test_ep_and_dp_attn_suffixes(pytester: pytest.Pytester, write_master, master_entry) -> None:  # type: ignore[no-untyped-def]
    write_master(
        master_entry(
            "k-fp4-mi355x-atom",
            [
                "{ tp: 8, ep: 8, dp-attn: true, conc-list: [4] }",
                "{ tp: 8, ep: 1, dp-attn: false, conc-list: [4] }",
            ],
        )
    )
    assert collected(pytester) == [
        "amd-master.yaml::k-fp4-mi355x-atom-tp8-ep8-dpa::isl1024-osl1024-conc4",
        "amd-master.yaml::k-fp4-mi355x-atom-tp8::isl1024-osl1024-conc4",
    ]


def test_key_with_mtp_gets_no_second_suffix(
    pytester: pytest.Pytester,
    write_master,  # type: ignore[no-untyped-def]
    master_entry,
) -> None:
    write_master(
        master_entry("m-fp4-mi355x-atom-mtp", ["{ tp: 4, spec-decoding: mtp, conc-list: [8] }"])
    )
    assert collected(pytester) == [
        "amd-master.yaml::m-fp4-mi355x-atom-mtp-tp4::isl1024-osl1024-conc8"
    ]


def test_k_selection_by_substring(pytester: pytest.Pytester, write_master, master_entry) -> None:  # type: ignore[no-untyped-def]
    write_master(
        master_entry("minimaxm3-fp4-mi355x-atom", ["{ tp: 4, conc-start: 1, conc-end: 64 }"])
        + "\n"
        + master_entry(
            "other-fp8-h200-vllm", ["{ tp: 8, conc-list: [16] }"], runner="h200", framework="vllm"
        )
    )
    # Both entries have model-prefix minimaxm3: -k matches it as a keyword, not only the key.
    assert len(collected(pytester, "-k", "minimaxm3")) == 8
    assert len(collected(pytester, "-k", "minimaxm3 and atom")) == 7
    assert len(collected(pytester, "-k", "atom")) == 7
    assert len(collected(pytester, "-k", "mi355x")) == 7
    assert len(collected(pytester, "-k", "vllm")) == 1
    assert len(collected(pytester, "-k", "h200")) == 1
    assert collected(pytester, "-k", "conc64") == [
        "amd-master.yaml::minimaxm3-fp4-mi355x-atom-tp4::isl1024-osl1024-conc64"
    ]


def test_m_selection_by_marker_kwargs(
    pytester: pytest.Pytester, write_master, master_entry
) -> None:  # type: ignore[no-untyped-def]
    write_master(
        master_entry(
            "k-fp4-mi355x-atom",
            ["{ tp: 4, conc-list: [16, 64] }", "{ tp: 8, conc-list: [16, 64] }"],
        )
    )
    assert collected(pytester, "-m", "inferbench(conc=64)") == [
        "amd-master.yaml::k-fp4-mi355x-atom-tp4::isl1024-osl1024-conc64",
        "amd-master.yaml::k-fp4-mi355x-atom-tp8::isl1024-osl1024-conc64",
    ]
    assert collected(pytester, "-m", "inferbench(tp=8, conc=16)") == [
        "amd-master.yaml::k-fp4-mi355x-atom-tp8::isl1024-osl1024-conc16"
    ]
    assert collected(pytester, "-m", 'inferbench(framework="atom", spec_decoding="mtp")') == []
    # Runner and hardware match in either case (runners are written lower, hardware upper).
    tp8 = ["amd-master.yaml::k-fp4-mi355x-atom-tp8::isl1024-osl1024-conc16"]
    for query in ("hardware='mi355x'", "hardware='MI355X'", "runner='MI355X'",
                  "runner='mi355x', hardware='MI355X'"):
        assert collected(pytester, "-m", f"inferbench({query}, tp=8, conc=16)") == tp8, query
    assert collected(pytester, "-m", "inferbench(hardware='mi300x')") == []


def test_only_master_files_are_recipes(
    pytester: pytest.Pytester, write_master, master_entry
) -> None:  # type: ignore[no-untyped-def]
    write_master(master_entry("k-fp4-mi355x-atom", ["{ tp: 4, conc-list: [1] }"]))
    # Other YAML (CI, compose) is never touched, even when it is not a valid recipe.
    (pytester.path / "docker-compose.yaml").write_text("services: [oops\n")
    (pytester.path / "nvidia-master.yml").write_text("not: [a recipe\n")
    assert len(collected(pytester)) == 1


def test_recipe_glob_from_ini(pytester: pytest.Pytester, write_master, master_entry) -> None:  # type: ignore[no-untyped-def]
    write_master(
        master_entry("k-fp4-mi355x-atom", ["{ tp: 4, conc-list: [1] }"]), name="my.bench.yaml"
    )
    assert collected(pytester) == []
    pytester.makeini("[pytest]\ninferbench_recipes = *.bench.yaml\n")
    assert collected(pytester) == ["my.bench.yaml::k-fp4-mi355x-atom-tp4::isl1024-osl1024-conc1"]


MULTINODE = """\
dsr1-fp8-mi355x-sglang-disagg:
  image: img
  model: deepseek-ai/DeepSeek-R1-0528
  model-prefix: dsr1
  runner: mi355x-disagg
  precision: fp8
  framework: sglang-disagg
  multinode: true
  disagg: true
  scenarios:
    fixed-seq-len:
      - isl: 1024
        osl: 1024
        search-space:
          - spec-decoding: none
            conc-list: [512, 1024]
            prefill:
              num-worker: 1
              tp: 8
              ep: 8
              dp-attn: true
              additional-settings: ["PREFILL_NODES=1"]
            decode: { num-worker: 2, tp: 8, ep: 8, dp-attn: true }
agent-fp4-b200-vllm:
  image: img
  model: m
  model-prefix: agent
  runner: b200-trt
  precision: fp4
  framework: vllm
  multinode: false
  scenarios:
    agentic-coding:
      - duration: 900
        search-space:
          - { tp: 8, offloading: cpu, conc-list: [4] }
"""


def test_multinode_runs_on_the_simulator_and_skips_elsewhere(
    pytester: pytest.Pytester, write_master
) -> None:  # type: ignore[no-untyped-def]
    write_master(MULTINODE)
    # The node name carries the whole topology: workers x TP, EP, DP-attention of both pools,
    # and a digest of their additional-settings.
    node = ("dsr1-fp8-mi355x-sglang-disagg-p1x8ep8dpa-d2x8ep8dpa-s"
            + settings_digest(("PREFILL_NODES=1",)))
    assert collected(pytester) == [
        f"amd-master.yaml::{node}::isl1024-osl1024-conc512",
        f"amd-master.yaml::{node}::isl1024-osl1024-conc1024",
        "amd-master.yaml::agent-fp4-b200-vllm-tp8-agentic-offload-cpu::agentic-conc4",
    ]
    result = pytester.runpytest("-rs", "--inferbench-prompts-per-conc", "1")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(
        ["*agentic-coding: offloading cpu is not simulated (the simulator's CPU-DRAM tier "
         "serves kv-offloading: dram)*"])
    # Other backends do not run multinode servers yet: they skip, saying which backend does
    # (the process backend replays the agentic point against the server it starts).
    result = pytester.runpytest("-rs", "--inferbench-backend", "process", "-k", "not agentic")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        ["*multinode: not supported by the process backend yet (runs on: sim, external)*"])
