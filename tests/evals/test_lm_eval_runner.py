"""Both runners score the same server responses the same way (needs the lm-eval extra)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from pytest_inferbench.backends.base import StartContext
from pytest_inferbench.evals.item import start_oracle_server
from pytest_inferbench.evals.lm_eval_runner import lm_eval_available, run_lm_eval, task_config
from pytest_inferbench.evals.runner import run_gsm8k_eval
from pytest_inferbench.launch import ClientOptions, resolve
from pytest_inferbench.options import Settings
from pytest_inferbench.schema import load_recipe
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]
RECIPE = master_entry(rows=["{ tp: 4, conc-start: 1, conc-end: 8 }"], isl=256, osl=16)


def test_task_config_carries_the_inferencex_filters(tmp_path: Path) -> None:
    config = task_config(tmp_path / "shots.jsonl", tmp_path / "scored.jsonl", chat=True)
    filters = {f["name"]: f["filter"][0] for f in config["filter_list"]}
    assert filters["strict-match"]["regex_pattern"] == r"#### (\-?[0-9\.\,]+)"
    assert filters["flexible-extract"]["regex_pattern"] == r"(-?[$0-9.,]{2,})|(-?[0-9]+)"
    assert config["metric_list"][0]["regexes_to_ignore"] == [",", "\\$", "(?s).*#### ", "\\.$"]
    assert config["generation_kwargs"]["until"] == ["</s>", "<|im_end|>"]


@pytest.mark.skipif(not lm_eval_available(), reason="lm-eval is not installed (extra: lm-eval)")
@pytest.mark.parametrize("chat", [False, True])
def test_builtin_and_lm_eval_runners_agree(
    tmp_path: Path, pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch, chat: bool
) -> None:
    (tmp_path / "bench-master.yaml").write_text(RECIPE)
    (tmp_path / "launch").mkdir()
    shutil.copy(REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml", tmp_path / "launch")
    data = tmp_path / "test.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "question": f"A crate holds {i} apples and {3 * i} pears. How many in all?",
                    "answer": f"{i} + {3 * i} = {4 * i}\n#### {4 * i}",
                }
            )
            + "\n"
            for i in range(1, 46)
        )
    )
    server = load_recipe(tmp_path / "bench-master.yaml").servers[0]
    spec = resolve(server, tmp_path / "launch")
    if chat:
        spec = dataclasses.replace(spec, client=ClientOptions(True, "/v1/chat/completions"))
    settings = dataclasses.replace(
        Settings.from_config(pytestconfig),
        eval_data=data,
        results_dir=tmp_path / "results",
        eval_limit=None,
    )
    ctx = StartContext(
        results_dir=tmp_path / "results", run_id="lmeval", worker_id="master", options=settings
    )
    monkeypatch.setenv("INFERBENCH_SIM_EVAL_ACCURACY", "0.7")
    handle = start_oracle_server(server, spec, settings, ctx)
    try:
        assert handle.base_url
        builtin = run_gsm8k_eval(handle.base_url, spec, server, settings, tmp_path)
        harness = run_lm_eval(handle.base_url, spec, server, settings, tmp_path)
    finally:
        handle.stop()
    assert builtin.n == harness.n == 40
    for ours, theirs in zip(builtin.scores, harness.scores, strict=True):
        assert ours.name == theirs.name
        assert ours.score == pytest.approx(theirs.score, abs=1e-9)
        assert ours.stderr == pytest.approx(theirs.stderr, abs=1e-9)
