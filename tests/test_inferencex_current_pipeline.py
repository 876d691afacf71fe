"""InferenceX's current `utils/process_result.py` and `utils/collect_results.py` (the tree in
`../shared/inferencex-0801`) ingest the plugin's point files, single-node and multinode.

A real plugin run (simulator) over a sample: a disaggregated multinode entry with a router and
a KV transfer backend, a second one that InferenceX's own naming cannot tell from it (only its
image differs), an aggregated multinode entry (decode pool of no workers, both pools naming their
hardware), and single-node rows with and without pipeline parallelism. The environment of every
point is made here from the YAML as InferenceX's generator and workflows make it, not by the
plugin; a multinode file is found by the workflow's own `${RESULT_FILENAME}_*.json` glob and its
GPU counts read back from its name with the workflow's patterns. The real script runs once per
point, as the workflow runs it, and its agg file must match the plugin's key for key, in order,
numbers to 0.1% (a simulated agg file has one more key, its `inferbench` stamp).

The second test collects every point of the current tree's master files and checks that no two
live points share a file name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_inferbench.recipe.agentic import SCENARIO as AGENTIC_SCENARIO
from pytest_inferbench.results.power import AGG_KEYS as POWER_KEYS

REPO = Path(__file__).resolve().parents[1]
CURRENT = REPO.parent / "shared" / "inferencex-0801"
UTILS = CURRENT / "utils"
needs_tree = pytest.mark.skipif(not (UTILS / "process_result.py").is_file(),
                                reason=f"no current InferenceX tree at {CURRENT}")

DISAGG_POOLS = """
      - conc-list: [4, 8]
        prefill: { num-worker: 1, tp: 8, ep: 1, dp-attn: false, additional-settings: ["P=1"] }
        decode: { num-worker: 1, tp: 8, ep: 1, dp-attn: false, additional-settings: ["D=1"] }
"""
HEAD = """
  model: Qwen/Qwen3.5-397B-A17B-FP8
  model-prefix: qwen3.5
  precision: fp8
  scenarios:
    fixed-seq-len:
    - isl: 1024
      osl: 256
      search-space:"""
SAMPLE = f"""
qwen3.5-fp8-mi355x-sglang-disagg:
  image: lmsysorg/sglang:v0.5.14-rocm720-mi35x
  runner: mi355x-disagg
  framework: sglang-disagg
  router: {{ name: sglang-router, version: "0.3.2" }}
  kv-p2p-transfer: mori
  multinode: true
  disagg: true{HEAD}{DISAGG_POOLS}
qwen3.5-fp8-mi355x-sglang-disagg-next:
  image: lmsysorg/sglang:v0.5.15-rocm720-mi35x
  runner: mi355x-disagg
  framework: sglang-disagg
  router: {{ name: sglang-router, version: "0.3.2" }}
  kv-p2p-transfer: mori
  multinode: true
  disagg: true{HEAD}{DISAGG_POOLS}
qwen3.5-fp8-mi355x-sglang-disagg-agg:
  image: lmsysorg/sglang:v0.5.14-rocm720-mi35x
  runner: mi355x-disagg
  framework: sglang-disagg
  multinode: true
  disagg: false{HEAD}
      - conc-list: [4]
        prefill: {{ num-worker: 1, tp: 8, ep: 1, dp-attn: false, hardware: MI355X }}
        decode: {{ num-worker: 0, tp: 8, ep: 1, dp-attn: false, hardware: MI355X }}
qwen3.5-fp8-mi355x-sglang:
  image: lmsysorg/sglang-rocm:v0.5.16-rocm720-mi35x-20260726
  runner: mi355x
  framework: sglang
  router: {{ name: sglang-router, version: "0.3.2" }}
  multinode: false{HEAD}
      - {{ tp: 4, ep: 1, conc-list: [4] }}
      - {{ tp: 2, pp: 2, conc-list: [2] }}
"""


def flag(value: Any) -> str:
    return "true" if value else "false"


def workflow_envs(recipe: Path) -> list[tuple[str, dict[str, str]]]:
    """(config key, env) of every point, as generate_sweep_configs.py and the two benchmark
    workflow templates give it; a multinode env's RESULT_FILENAME is the job's (the row's)."""
    out = []
    for key, entry in yaml.safe_load(recipe.read_text()).items():
        for scenario in entry["scenarios"]["fixed-seq-len"]:
            isl, osl = scenario["isl"], scenario["osl"]
            seq = {(1024, 1024): "1k1k", (8192, 1024): "8k1k"}.get((isl, osl), f"{isl}_{osl}")
            for row in scenario["search-space"]:
                router = row.get("router", entry.get("router"))
                base = {
                    "RUNNER_TYPE": entry["runner"], "FRAMEWORK": entry["framework"],
                    "PRECISION": entry["precision"],
                    "SPEC_DECODING": row.get("spec-decoding", "none"),
                    "ISL": str(isl), "OSL": str(osl), "DISAGG": flag(entry.get("disagg")),
                    "MODEL_PREFIX": entry["model-prefix"], "IMAGE": entry["image"],
                    "ROUTER_METADATA": json.dumps(router) if router else "",
                    "KV_P2P_TRANSFER": entry.get("kv-p2p-transfer", ""),
                }
                head = f"{entry['model-prefix']}_{seq}_{entry['precision']}_{entry['framework']}"
                tail = f"_disagg-{base['DISAGG']}_spec-{base['SPEC_DECODING']}"
                if entry["multinode"]:
                    env = dict(base, IS_MULTINODE="true")
                    names = []
                    for pool in ("prefill", "decode"):
                        worker, prefix = row[pool], pool.upper() + "_"
                        env |= {
                            prefix + "NUM_WORKERS": str(worker["num-worker"]),
                            prefix + "TP": str(worker["tp"]),
                            prefix + "PP_SIZE": str(worker.get("pp", 1)),
                            prefix + "DCP_SIZE": str(worker.get("dcp-size", 1)),
                            prefix + "PCP_SIZE": str(worker.get("pcp-size", 1)),
                            prefix + "EP": str(worker["ep"]),
                            prefix + "DP_ATTN": flag(worker["dp-attn"]),
                            prefix + "HARDWARE": worker.get("hardware", ""),
                        }
                        names.append(
                            f"{pool}-tp{worker['tp']}-pp{env[prefix + 'PP_SIZE']}"
                            f"-dcp{env[prefix + 'DCP_SIZE']}-pcp{env[prefix + 'PCP_SIZE']}"
                            f"-ep{worker['ep']}-dp{env[prefix + 'DP_ATTN']}"
                            f"-nw{worker['num-worker']}")
                    concs = "x".join(map(str, row["conc-list"]))
                    env["RESULT_FILENAME"] = (f"{head}_{'_'.join(names)}{tail}_conc{concs}"
                                              f"_{entry['runner']}")
                    out += [(key, dict(env, CONC=str(conc))) for conc in row["conc-list"]]
                    continue
                for conc in row["conc-list"]:
                    env = dict(base, TP=str(row["tp"]), PP_SIZE=str(row.get("pp", 1)),
                               DCP_SIZE=str(row.get("dcp-size", 1)),
                               PCP_SIZE=str(row.get("pcp-size", 1)),
                               EP_SIZE=str(row.get("ep", 1)),
                               DP_ATTENTION=flag(row.get("dp-attn")))
                    env["RESULT_FILENAME"] = (
                        f"{head}_tp{env['TP']}-pp{env['PP_SIZE']}-dcp{env['DCP_SIZE']}"
                        f"-pcp{env['PCP_SIZE']}-ep{env['EP_SIZE']}-dpa{env['DP_ATTENTION']}"
                        f"{tail}_conc{conc}_{entry['runner']}")
                    out.append((key, env))
    return out


def multinode_file(points: Path, key: str, env: dict[str, str]) -> dict[str, str]:
    """The env process_result.py runs with for a multinode point: the workflow globs
    `${RESULT_FILENAME}_*.json` and reads the GPU counts from the file name (its sed patterns).
    Points of entries InferenceX names alike are told apart by the raw file's config key."""
    matches = [path for path in points.glob(f"{env['RESULT_FILENAME']}_*.json")
               if re.search(f"_conc{env['CONC']}_gpus_", path.name)
               and json.loads(path.read_text())["inferbench"]["config_key"] == key]
    assert len(matches) == 1, (key, env["RESULT_FILENAME"], matches)
    name = matches[0].name
    gpus = re.fullmatch(r".*_gpus_([0-9][0-9]*).*\.json", name)
    ctx = re.fullmatch(r".*_ctx_([0-9]*).*\.json", name)
    gen = re.fullmatch(r".*_gen_([0-9]*).*\.json", name)
    assert gpus is not None
    prefill, decode = (ctx[1], gen[1]) if ctx and gen else (gpus[1], "0")
    return dict(env, RESULT_FILENAME=name.removesuffix(".json"), PREFILL_GPUS=prefill,
                DECODE_GPUS=decode)


def assert_same(ours: dict[str, Any], theirs: dict[str, Any], name: str) -> None:
    assert list(ours) == list(theirs), name
    for key, value in theirs.items():
        assert type(ours[key]) is type(value), (name, key)
        if isinstance(value, float):
            assert ours[key] == pytest.approx(value, rel=1e-3), (name, key)
        else:
            assert ours[key] == value, (name, key)


@needs_tree
def test_current_process_result_and_collect_results_take_every_file(
        pytester: pytest.Pytester) -> None:
    recipe = pytester.path / "sample-master.yaml"
    recipe.write_text(SAMPLE)
    rows = workflow_envs(recipe)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferbench-no-plots",
                                           "--inferbench-prompts-per-conc", "2")
    result.assert_outcomes(passed=len(rows))
    points = pytester.path / "inferbench-results" / "points"
    summary = {p["result_filename"]: p for p in json.loads(
        (pytester.path / "inferbench-results" / "summary.json").read_text())["points"]}
    envs = [multinode_file(points, key, env) if env.get("IS_MULTINODE") else env
            for key, env in rows]
    names = [env["RESULT_FILENAME"] for env in envs]
    assert len(set(names)) == len(names) == len(summary)  # no point overwrote another's files
    assert {p.name for p in points.iterdir()} == {
        f"{prefix}{name}.json" for name in names for prefix in ("", "agg_")}
    kinds = set()
    for env in envs:
        name = env["RESULT_FILENAME"]
        agg = points / f"agg_{name}.json"
        ours = json.loads(agg.read_text())
        agg.unlink()  # process_result writes its own in its place
        done = subprocess.run(
            [sys.executable, str(UTILS / "process_result.py")], cwd=points, env={
                "PATH": os.environ.get("PATH", ""), **{k: v for k, v in env.items()
                                                       if k != "CONC"}},
            capture_output=True, text=True, check=False)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        theirs = json.loads(agg.read_text())
        assert ours.pop("inferbench") == {"simulated": True}
        # The simulator's power fields: the script adds power only from a GPU-metrics CSV,
        # which a simulated point has none of (tests/test_power.py runs it on measured ones).
        power = {key: ours.pop(key) for key in POWER_KEYS if key in ours}
        assert power["power_valid"] == (0 if env.get("IS_MULTINODE") else 1), name
        assert_same(ours, theirs, name)
        # The plugin's own table and summary say the same per-GPU throughput.
        assert theirs["tput_per_gpu"] == pytest.approx(summary[name]["tput_per_gpu"], rel=1e-3)
        agg.write_text(json.dumps(ours | power | {"inferbench": {"simulated": True}}))
        kinds.add((theirs["is_multinode"], theirs["disagg"], "router" in theirs,
                   "prefill_hw" in theirs, theirs.get("pp", 1) > 1))
    assert kinds == {(True, True, True, False, False), (True, False, False, True, False),
                     (False, False, True, False, False), (False, False, True, False, True)}

    # collect_results.py over the agg files, as the collect workflow downloads them.
    downloaded = pytester.path / "results_bmk"
    downloaded.mkdir()
    for name in names:
        shutil.copy(points / f"agg_{name}.json", downloaded)
    done = subprocess.run([sys.executable, str(UTILS / "collect_results.py"), str(downloaded),
                           "bmk"], cwd=pytester.path, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    collected = json.loads((pytester.path / "agg_bmk.json").read_text())
    assert sorted(map(json.dumps, collected)) == sorted(
        json.dumps(json.loads((downloaded / f"agg_{name}.json").read_text())) for name in names)


@needs_tree
def test_no_two_live_points_of_the_current_configs_share_a_file_name(
        pytester: pytest.Pytester) -> None:
    for master in sorted((CURRENT / "configs").glob("*.yaml")):
        shutil.copy(master, pytester.path / master.name)
    items, _ = pytester.inline_genitems("-p", "no:cacheprovider")
    points = [item.point for item in items  # type: ignore[attr-defined]
              if hasattr(item, "point") and item.get_closest_marker("skip") is None]
    multinode = [p for p in points if p.server.multinode]
    assert multinode and len(multinode) < len(points)
    fixed = [p for p in points if p.server.scenario != AGENTIC_SCENARIO]
    names = [p.result_filename() for p in fixed]
    assert len(set(names)) == len(names)
    # InferenceX names an agentic point by its exp name, precision, framework and runner, so two
    # config keys that differ in nothing else (e.g. qwen3.5's plain and `-hicache` entries at
    # `kv-offloading: none`) are named alike there as here (the writer gives the second `_2`);
    # within one config key no two agentic points share a name.
    agentic = [(p.server.config_key, p.result_filename()) for p in points
               if p.server.scenario == AGENTIC_SCENARIO]
    assert agentic and len(set(agentic)) == len(agentic)
