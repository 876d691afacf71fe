"""InferenceX's own `utils/process_result.py` ingests every point file of a simulated sweep.

A real plugin run (simulator) over the shipped MiniMax-M3 MI355X ATOM sweep (72 points: plain
and EAGLE3/MTP nodes) plus a sample recipe with expert parallelism and DP attention. For every
row of the matrix -- expanded here from the recipe YAML as InferenceX's generator does, not by
the plugin -- the real script runs in the points directory with the environment
`benchmark-tmpl.yml` gives it (one Python subprocess executes it once per row, as a fresh
`__main__` each time, to save 75 interpreter starts), and its `agg_*.json` must equal the
plugin's field for field (a simulated agg file has exactly one more key, its `inferbench`
stamp). Any schema drift between the two fails here.

The file names are the current workflow's (`tp<N>-pp<N>-dcp<N>-pcp<N>-ep<N>`; the script takes
whatever name it is given), and the agg file is the current script's: three keys the older
script does not write (`pp`, `dcp_size`, `pcp_size`, all 1 here), every one of its keys in its
order with its values. `test_inferencex_current_pipeline.py` checks against the current script.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_inferbench.results.power import AGG_KEYS as POWER_KEYS
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[1]
INFERENCEX = REPO.parent / "shared" / "inferencex"
PROCESS_RESULT = INFERENCEX / "utils" / "process_result.py"
RUNNER_NAME = "mi355x-amds_03"
# Runs process_result.py once per env on stdin (a JSON list), as a fresh __main__ each time;
# prints one JSON line per run: {"name", "error"}.
DRIVER = """
import contextlib, io, json, os, runpy, sys, traceback
for env in json.load(sys.stdin):
    os.environ.update(env)
    error = ""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(sys.argv[1], run_name="__main__")
    except BaseException:
        error = traceback.format_exc()
    print(json.dumps({"name": env["RESULT_FILENAME"], "error": error}))
"""
# What the current process_result.py writes and this older one does not (single-node).
CURRENT_ONLY = ("pp", "dcp_size", "pcp_size")
SAMPLE = master_entry(
    "minimaxm3-fp4-mi355x-atom-sample",
    ["{ tp: 8, conc-list: [4] }",
     "{ tp: 4, ep: 4, dp-attn: true, conc-list: [8] }",
     "{ tp: 8, ep: 8, dp-attn: true, spec-decoding: mtp, conc-list: [16] }"],
    isl=1024, osl=256)

# benchmark_serving.py --save-result without --save-detailed (inferencex-formats.md §3.5).
RAW_KEYS = {
    "date", "backend", "model_id", "tokenizer_id", "best_of", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "benchmark_start_time_unix",
    "benchmark_end_time_unix", "completed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput:", "output_throughput", "total_token_throughput",
    "input_lens", "output_lens",
    *(f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el")
      for stat in ("mean", "median", "std", "p90", "p99", "p99.9")),
}


def conc_values(row: dict[str, Any]) -> list[int]:
    """generate_sweep_configs: a list as given, or start..end doubling, clamped to the end."""
    if "conc-list" in row:
        return list(row["conc-list"])
    values, conc = [], row["conc-start"]
    while True:
        values.append(conc)
        if conc == row["conc-end"]:
            return values
        conc = min(conc * 2, row["conc-end"])


def matrix_rows(recipe: Path, selected: str) -> list[dict[str, str]]:
    """The env of every matrix row whose key contains `selected`, as benchmark-tmpl.yml sets it."""
    rows = []
    for key, entry in yaml.safe_load(recipe.read_text()).items():
        if not all(word in key for word in selected.split()):
            continue
        for scenario in entry["scenarios"]["fixed-seq-len"]:
            isl, osl = scenario["isl"], scenario["osl"]
            seq = {(1024, 1024): "1k1k", (8192, 1024): "8k1k"}.get((isl, osl), f"{isl}_{osl}")
            for row in scenario["search-space"]:
                for conc in conc_values(row):
                    env = {
                        "RUNNER_TYPE": entry["runner"], "FRAMEWORK": entry["framework"],
                        "PRECISION": entry["precision"],
                        "SPEC_DECODING": row.get("spec-decoding", "none"),
                        "ISL": str(isl), "OSL": str(osl), "DISAGG": "false",
                        "MODEL_PREFIX": entry["model-prefix"], "IMAGE": entry["image"],
                        "TP": str(row["tp"]), "EP_SIZE": str(row.get("ep", 1)),
                        "DP_ATTENTION": "true" if row.get("dp-attn") else "false",
                    }
                    env["RESULT_FILENAME"] = (
                        f"{entry['model-prefix']}_{seq}_{env['PRECISION']}_{env['FRAMEWORK']}"
                        f"_tp{env['TP']}-pp1-dcp1-pcp1-ep{env['EP_SIZE']}"
                        f"-dpa{env['DP_ATTENTION']}"
                        f"_disagg-{env['DISAGG']}_spec-{env['SPEC_DECODING']}_conc{conc}"
                        f"_{RUNNER_NAME}")
                    rows.append(env)
    return rows


@pytest.mark.skipif(not PROCESS_RESULT.is_file(), reason=f"no InferenceX checkout at {INFERENCEX}")
def test_process_result_reproduces_every_agg_file(pytester: pytest.Pytester) -> None:
    for name in ("amd-master.yaml", "gates.yaml"):
        shutil.copy(REPO / "benchmarks" / name, pytester.path / name)
    shutil.copytree(REPO / "benchmarks" / "launch", pytester.path / "launch")
    (pytester.path / "sample-master.yaml").write_text(SAMPLE)
    selected = "minimaxm3 mi355x atom"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-k", selected.replace(" ", " and "), "-m", "not eval",
        "--inferbench-prompts-per-conc", "2", "--inferbench-runner-name", RUNNER_NAME,
        "--inferbench-no-plots")
    rows = matrix_rows(pytester.path / "amd-master.yaml", selected)
    sample_rows = matrix_rows(pytester.path / "sample-master.yaml", selected)
    assert len(rows) == 72 and len(sample_rows) == 3
    rows += sample_rows
    result.assert_outcomes(passed=len(rows))

    points = pytester.path / "inferbench-results" / "points"
    expected = {f"{r['RESULT_FILENAME']}.json" for r in rows}
    assert {p.name for p in points.iterdir()} == expected | {f"agg_{n}" for n in expected}
    ours_by_name = {}
    for env in rows:
        name = env["RESULT_FILENAME"]
        raw = json.loads((points / f"{name}.json").read_text())
        assert set(raw) == RAW_KEYS | {"inferbench"}
        assert raw["backend"] == "vllm"  # completions; MTP templates client-side (InferenceX)
        assert raw["inferbench"]["simulated"] is True
        ours_by_name[name] = json.loads((points / f"agg_{name}.json").read_text())
        (points / f"agg_{name}.json").unlink()  # process_result writes its own in its place
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(PROCESS_RESULT)], cwd=points, input=json.dumps(rows),
        capture_output=True, text=True, env={"PATH": os.environ.get("PATH", "")}, check=False)
    assert done.returncode == 0, done.stderr
    runs = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["name"] for r in runs] == [env["RESULT_FILENAME"] for env in rows]
    assert [r for r in runs if r["error"]] == []
    kinds = set()
    for env in rows:
        name = env["RESULT_FILENAME"]
        ours = ours_by_name[name]
        theirs = json.loads((points / f"agg_{name}.json").read_text())
        assert ours.pop("inferbench") == {"simulated": True}
        assert {key: ours.pop(key) for key in CURRENT_ONLY} == dict.fromkeys(CURRENT_ONLY, 1)
        # The simulator's power fields, which the script adds only from a GPU-metrics CSV.
        assert {key: ours.pop(key) for key in POWER_KEYS}["power_valid"] == 1, name
        assert list(ours) == list(theirs), name
        for key, value in theirs.items():
            assert type(ours[key]) is type(value), (name, key)
            assert ours[key] == value, (name, key)
        kinds.add((env["SPEC_DECODING"], env["DP_ATTENTION"], env["EP_SIZE"] != "1"))
    assert kinds == {("none", "false", False), ("mtp", "false", False),
                     ("none", "true", True), ("mtp", "true", True)}
