"""The builtin runner as InferenceX's run_eval: chat for every node, its eval point and
concurrency rule, and max_tokens from the eval context length."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx

from pytest_inferbench.evals.runner import eval_job, eval_max_tokens, plan_eval, run_gsm8k_eval
from pytest_inferbench.recipe.model import SeqLenSweep


def test_every_node_is_evaluated_over_chat_with_the_context_budget(oracle_node, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: E501
    node = oracle_node
    assert not node.spec.client.use_chat_template  # a plain node: InferenceX still uses chat
    httpx.delete(node.base_url + "/debug/inferbench/timeline")
    job = eval_job(node.server, node.spec, node.settings)
    result = run_gsm8k_eval(node.base_url, job, tmp_path)
    assert result.endpoint == "/v1/chat/completions"
    assert result.n == 40  # no train.jsonl beside: five items became the shot pool
    assert result.failed_requests == 0
    # No 8k1k point at concurrency >= 16 in this node: its highest concurrency.
    assert result.concurrency == 8
    assert 0.0 < result.scores[0].score < 1.0
    # The launch argv's --max-model-len 32768 is the eval context: 32768 - 4096 new tokens,
    # capped at 16384.
    assert result.plan is not None and result.plan.context_length == 32768
    assert result.plan.max_tokens == 16384
    served = httpx.get(node.base_url + "/debug/inferbench/timeline").json()["requests"]
    assert len(served) == 40  # every question reached the server once


def test_eval_point_and_budget_follow_inferencex(oracle_node) -> None:  # type: ignore[no-untyped-def]
    sweeps = (SeqLenSweep(1024, 1024, (1, 2, 4, 8, 16, 32, 64), 1),
              SeqLenSweep(8192, 1024, (1, 2, 4, 8, 16, 32, 64, 128), 1))
    server = dataclasses.replace(oracle_node.server, sweeps=sweeps)
    no_context_flag = dataclasses.replace(oracle_node.spec, argv=("vllm", "serve", "m"))
    plan = plan_eval(server, no_context_flag)
    # 8k1k, highest concurrency >= 16; context = the matrix's max-model-len 8192 + 1024 + 256.
    assert (plan.concurrency, plan.isl, plan.osl) == (128, 8192, 1024)
    assert (plan.context_length, plan.max_tokens) == (9472, 9472 - 4096)
    assert plan_eval(server, oracle_node.spec).context_length == 32768  # the launched context
    assert eval_max_tokens(4000) == 2000  # a small context: half of it
    assert eval_max_tokens(131072) == 16384  # capped
