"""The builtin runner against the simulated HTTP server: chat and completions agree."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from pytest_inferbench.backends.base import StartContext
from pytest_inferbench.evals.item import start_oracle_server
from pytest_inferbench.evals.runner import run_gsm8k_eval
from pytest_inferbench.launch import ClientOptions, resolve
from pytest_inferbench.options import Settings
from pytest_inferbench.schema import load_recipe
from pytest_inferbench.testing.recipes import master_entry

REPO = Path(__file__).resolve().parents[2]
RECIPE = master_entry(rows=["{ tp: 4, conc-start: 1, conc-end: 8 }"], isl=256, osl=16)


def test_chat_and_completions_give_the_same_score(
    tmp_path: Path, pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bench-master.yaml").write_text(RECIPE)
    (tmp_path / "launch").mkdir()
    shutil.copy(REPO / "benchmarks/launch/minimaxm3_fp4_mi355x_atom.yaml", tmp_path / "launch")
    data = tmp_path / "test.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "question": f"A box holds {i} pens and {i + 7} pencils. How many in all?",
                    "answer": f"{i} + {i + 7} = {2 * i + 7}\n#### {2 * i + 7}",
                }
            )
            + "\n"
            for i in range(45)
        )
    )
    server = load_recipe(tmp_path / "bench-master.yaml").servers[0]
    spec = resolve(server, tmp_path / "launch")
    settings = dataclasses.replace(
        Settings.from_config(pytestconfig),
        eval_data=data,
        results_dir=tmp_path / "results",
        eval_limit=None,
    )
    ctx = StartContext(
        results_dir=tmp_path / "results", run_id="evaltest", worker_id="master", options=settings
    )
    monkeypatch.setenv("INFERBENCH_SIM_EVAL_ACCURACY", "0.7")
    handle = start_oracle_server(server, spec, settings, ctx)
    try:
        assert handle.base_url
        completions = run_gsm8k_eval(handle.base_url, spec, server, settings, tmp_path)
        chat_spec = dataclasses.replace(spec, client=ClientOptions(True, "/v1/chat/completions"))
        chat = run_gsm8k_eval(handle.base_url, chat_spec, server, settings, tmp_path)
    finally:
        handle.stop()
    assert (completions.endpoint, chat.endpoint) == ("/v1/completions", "/v1/chat/completions")
    assert completions.n == chat.n == 40  # no train.jsonl beside: five items became the shots
    assert completions.failed_requests == chat.failed_requests == 0
    assert completions.concurrency == 8  # the node's highest concurrency
    # The oracle's verdict is per question, so both endpoints must score identically.
    assert [s.score for s in completions.scores] == [s.score for s in chat.scores]
    assert 0.0 < completions.scores[0].score < 1.0
