"""Both runners score the same server responses the same way (needs the lm-eval extra)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_inferbench.evals.lm_eval_runner import lm_eval_available, run_lm_eval, task_config
from pytest_inferbench.evals.runner import eval_job, run_gsm8k_eval


def test_task_config_carries_the_inferencex_filters(tmp_path: Path) -> None:
    config = task_config(tmp_path / "shots.jsonl", tmp_path / "scored.jsonl")
    filters = {f["name"]: f["filter"][0] for f in config["filter_list"]}
    assert filters["strict-match"]["regex_pattern"] == r"#### (\-?[0-9\.\,]+)"
    assert filters["flexible-extract"]["regex_pattern"] == r"(-?[$0-9.,]{2,})|(-?[0-9]+)"
    assert config["metric_list"][0]["regexes_to_ignore"] == [",", "\\$", "(?s).*#### ", "\\.$"]
    assert config["generation_kwargs"]["until"] == ["</s>", "<|im_end|>"]


@pytest.mark.skipif(not lm_eval_available(), reason="lm-eval is not installed (extra: lm-eval)")
def test_builtin_and_lm_eval_runners_agree(oracle_node, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    node = oracle_node
    spec = node.spec
    job = eval_job(node.server, spec, node.settings)
    builtin = run_gsm8k_eval(node.base_url, job, tmp_path)
    harness = run_lm_eval(node.base_url, job, tmp_path)
    assert builtin.n == harness.n == 40
    for ours, theirs in zip(builtin.scores, harness.scores, strict=True):
        assert ours.name == theirs.name
        assert ours.score == pytest.approx(theirs.score, abs=1e-9)
        assert ours.stderr == pytest.approx(theirs.stderr, abs=1e-9)
