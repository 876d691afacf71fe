"""InferenceX's current master-file schema collects alongside the older one."""

from __future__ import annotations

import pytest

from pytest_inferbench.recipe.model import settings_digest

FINGERPRINT = "ab" * 32
CURRENT = f"""\
qwen3.5-fp8-rtx6000pro-vllm:
  image: vllm/vllm-openai:v0.21.0
  model: Qwen/Qwen3.5-397B-A17B-FP8
  model-prefix: qwen3.5
  runner: rtx6000pro-lat
  precision: fp8
  framework: vllm
  multinode: false
  disagg: false
  router: {{ name: vllm-router, version: "0.1.9" }}
  recipe-fingerprint: "{FINGERPRINT}"
  scenarios:
    fixed-seq-len:
      - isl: 1024
        osl: 1024
        search-space:
          - {{ tp: 8, pp: 2, dcp-size: 4, pcp-size: 2, conc-list: [4, 8] }}
          - {{ tp: 8, ep: 8, dp-attn: true, recipe-fingerprint: "{FINGERPRINT}",
               conc-list: [16] }}
kimik3-fp4-mi355x-vllm-disagg:
  image: vllm/vllm-openai-rocm:nightly
  model: moonshotai/Kimi-K3
  model-prefix: kimik3
  runner: "cluster:mi355x-amds"
  precision: fp4
  framework: vllm-disagg
  multinode: true
  disagg: true
  router: {{ name: vllm-router, version: nightly-20260809 }}
  kv-p2p-transfer: moriio
  scenarios:
    fixed-seq-len:
      - isl: 8192
        osl: 1024
        search-space:
          - conc-list: [64, 128]
            prefill: {{ hardware: mi355x, num-worker: 1, tp: 8, ep: 8, dp-attn: true, pp: 1,
                        additional-settings: ["CONFIG_FILE=disagg-1p1d.yaml"] }}
            decode: {{ hardware: mi355x, num-worker: 1, tp: 8, ep: 8, dp-attn: true,
                       dcp-size: 8, pcp-size: 1 }}
    agentic-coding:
      - dram-utilization: 0.6
        search-space:
          - conc-list: [40]
            kv-offloading: dram
            kv-offload-backend: {{ name: lmcache-k3, version: git-140819c9 }}
            prefill: {{ num-worker: 1, tp: 8, ep: 1, dp-attn: false }}
            decode: {{ num-worker: 1, tp: 8, ep: 1, dp-attn: false, dcp-size: 8 }}
glm5-fp8-gb300-sglang-agentic:
  image: lmsysorg/sglang:v0.5.12
  model: zai-org/GLM-5-FP8
  model-prefix: glm5
  runner: "cluster:gb300-nv"
  precision: fp8
  framework: sglang
  multinode: false
  scenarios:
    agentic-coding:
      - search-space:
          - {{ tp: 4, kv-offloading: none, conc-list: [1, 2] }}
"""


def test_a_file_in_the_current_schema_collects(pytester: pytest.Pytester) -> None:
    (pytester.path / "nvidia-master.yaml").write_text(CURRENT, encoding="utf-8")
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    disagg = ("kimik3-fp4-mi355x-vllm-disagg-p1x8ep8dpa-mi355x-d1x8dcp8ep8dpa-mi355x-s"
              + settings_digest(("CONFIG_FILE=disagg-1p1d.yaml",)))
    assert [line for line in result.outlines if "::" in line] == [
        f"nvidia-master.yaml::qwen3.5-fp8-rtx6000pro-vllm-tp8-pp2-dcp4-pcp2::{p}"
        for p in ("isl1024-osl1024-conc4", "isl1024-osl1024-conc8")
    ] + [
        "nvidia-master.yaml::qwen3.5-fp8-rtx6000pro-vllm-tp8-ep8-dpa::isl1024-osl1024-conc16",
        f"nvidia-master.yaml::{disagg}::isl8192-osl1024-conc64",
        f"nvidia-master.yaml::{disagg}::isl8192-osl1024-conc128",
        "nvidia-master.yaml::kimik3-fp4-mi355x-vllm-disagg-p1x8-d1x8dcp8-agentic-offload-dram"
        "-lmcache-k3::agentic-conc40",
        "nvidia-master.yaml::glm5-fp8-gb300-sglang-agentic-tp4::agentic-conc1",
        "nvidia-master.yaml::glm5-fp8-gb300-sglang-agentic-tp4::agentic-conc2",
    ]


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("pcp-size: 2,", "pcp-sise: 2,", "search-space[0].pcp-sise: unknown key"),
        ("dcp-size: 4,", "dcp-size: 3,", "tp (8) is not divisible by dcp-size (3)"),
        ("      - dram-utilization: 0.6\n", "      - dram-utilization: 1.5\n",
         "dram-utilization: got float 1.5 (expected a number in (0, 1])"),
        ("kv-offloading: none", "kv-offloading: ssd", "kv-offloading: got str 'ssd'"),
        ("version: nightly-20260809 }", "}", "router.version: missing required key"),
        (f'recipe-fingerprint: "{FINGERPRINT}"\n', 'recipe-fingerprint: "abc"\n',
         "recipe-fingerprint: got 'abc' (expected 64 lowercase hex digits)"),
        ("hardware: mi355x, num-worker: 1, tp: 8, ep: 8, dp-attn: true, pp: 1,",
         "hardware: mi355x, num-worker: 1, tp: 8, ep: 8, dp-attn: true, pp: 0,",
         "prefill.pp: got 0 (expected an integer >= 1)"),
    ],
    ids=["unknown-key", "dcp-divides-tp", "dram-share", "kv-offloading-value",
         "router-version", "fingerprint", "worker-pp"],
)
def test_current_keys_are_checked_and_only_their_entry_fails(
    pytester: pytest.Pytester, old: str, new: str, problem: str
) -> None:
    assert old in CURRENT
    (pytester.path / "nvidia-master.yaml").write_text(CURRENT.replace(old, new, 1))
    # Only the invalid entry's item runs (benchmark points carry the inferbench marker).
    result = pytester.runpytest("-q", "-p", "no:cacheprovider", "-m", "not inferbench")
    # It fails, naming the problem; the other entries still collect their points.
    outcomes = result.parseoutcomes()
    assert outcomes.pop("deselected") >= 2, result.stdout.str()
    assert outcomes == {"failed": 1}, result.stdout.str()
    assert problem in result.stdout.str()
