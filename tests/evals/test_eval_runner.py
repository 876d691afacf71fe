"""The builtin runner against the simulated HTTP server: chat and completions agree."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pytest_inferbench.evals.runner import run_gsm8k_eval
from pytest_inferbench.launch import ClientOptions


def test_chat_and_completions_give_the_same_score(oracle_node, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    node = oracle_node
    completions = run_gsm8k_eval(node.base_url, node.spec, node.server, node.settings, tmp_path)
    chat_spec = dataclasses.replace(node.spec, client=ClientOptions(True, "/v1/chat/completions"))
    chat = run_gsm8k_eval(node.base_url, chat_spec, node.server, node.settings, tmp_path)
    assert (completions.endpoint, chat.endpoint) == ("/v1/completions", "/v1/chat/completions")
    assert completions.n == chat.n == 40  # no train.jsonl beside: five items became the shots
    assert completions.failed_requests == chat.failed_requests == 0
    assert completions.concurrency == 8  # the node's highest concurrency
    # The oracle's verdict is per question, so both endpoints must score identically.
    assert [s.score for s in completions.scores] == [s.score for s in chat.scores]
    assert 0.0 < completions.scores[0].score < 1.0
