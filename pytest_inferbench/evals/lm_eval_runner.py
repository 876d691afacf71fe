"""`--inferbench-eval-runner lm-eval`: EleutherAI lm-evaluation-harness against the server.

The task is written next to the results as `gsm8k_inferbench.yaml`: InferenceX's gsm8k.yaml
(prompt, stop strings, both filters, exact_match settings, lm-eval's default few-shot sampler
over the train split) over local jsonl files, with the same shot pool and scored items as the
builtin runner (`split_shots`). lm-eval runs as a subprocess (argv list) with the HF hub
offline and InferenceX's `run_lm_eval` arguments (`local-chat-completions
--apply_chat_template`, `max_length` and `max_tokens` from `runner.plan_eval`); its results
and samples are copied into the node's eval directory and feed the same threshold gate.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import yaml

from .gsm8k import (
    FILTERS,
    METRIC,
    NUM_FEWSHOT,
    REGEXES_TO_IGNORE,
    STOP_CHAT,
    TASK,
    FilterScore,
    GsmItem,
    doc_to_text,
)
from .runner import (
    CHAT_ENDPOINT,
    REQUEST_TIMEOUT_S,
    RETRIES,
    EvalJob,
    EvalPlan,
    EvalResult,
    eval_dir,
)

if TYPE_CHECKING:
    from pathlib import Path

    from ..results.record import JSONValue


LM_EVAL_TASK = "gsm8k_inferbench"
RUN_TIMEOUT_S = 4 * 3600.0


class LmEvalError(RuntimeError):
    """lm-eval is missing, failed, or wrote no results; the message says which."""


def lm_eval_available() -> bool:
    return importlib.util.find_spec("lm_eval") is not None


def _write_items(path: Path, items: list[GsmItem]) -> None:
    path.write_text(
        "".join(json.dumps({"question": i.question, "answer": i.answer}) + "\n" for i in items),
        encoding="utf-8",
    )


def task_config(shots_file: Path, scored_file: Path) -> dict[str, JSONValue]:
    return {
        "task": LM_EVAL_TASK,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"train": str(shots_file), "test": str(scored_file)}},
        "output_type": "generate_until",
        "training_split": "train",
        "fewshot_split": "train",
        "test_split": "test",
        "num_fewshot": NUM_FEWSHOT,
        "doc_to_text": doc_to_text("{{question}}"),
        "doc_to_target": "{{answer}}",
        "target_delimiter": " ",
        "fewshot_delimiter": "\n\n",
        "generation_kwargs": {
            "until": list(STOP_CHAT),
            "do_sample": False,
            "temperature": 0.0,
        },
        "repeats": 1,
        "metric_list": [
            {
                "metric": METRIC,
                "aggregation": "mean",
                "higher_is_better": True,
                "ignore_case": True,
                "ignore_punctuation": False,
                "regexes_to_ignore": list(REGEXES_TO_IGNORE),
            }
        ],
        # The same regexes the builtin runner scores with, so both runners agree by construction.
        "filter_list": [
            {
                "name": name,
                "filter": [
                    {"function": "regex", "regex_pattern": pattern.pattern, "group_select": -1},
                    {"function": "take_first"},
                ],
            }
            for name, pattern in FILTERS
        ],
        "metadata": {"version": 3.0},
    }


def lm_eval_argv(
    base_url: str, model: str, plan: EvalPlan, task_dir: Path, output_dir: Path
) -> list[str]:
    model_args = ",".join(
        [
            f"model={model}",
            f"base_url={base_url.rstrip('/')}{CHAT_ENDPOINT}",
            "eos_string=</s>",
            f"max_retries={RETRIES}",
            f"num_concurrent={plan.concurrency}",
            f"timeout={REQUEST_TIMEOUT_S:g}",
            "tokenized_requests=False",
            f"max_length={plan.context_length}",
            "tokenizer_backend=None",
        ]
    )
    argv = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "local-chat-completions",
        "--apply_chat_template",
        "--model_args",
        model_args,
        "--tasks",
        LM_EVAL_TASK,
        "--include_path",
        str(task_dir),
        "--gen_kwargs",
        f"max_tokens={plan.max_tokens},temperature=0,top_p=1",
        "--batch_size",
        "1",
        "--output_path",
        str(output_dir),
        "--log_samples",
    ]
    return argv


def run_lm_eval(base_url: str, job: EvalJob, results_dir: Path) -> EvalResult:
    if not lm_eval_available():
        raise LmEvalError(
            "--inferbench-eval-runner lm-eval needs lm-eval installed: "
            "pip install 'pytest-inferbench[lm-eval]'"
        )
    server, shots, items, model, plan = job.server, job.shot_pool, job.items, job.model, job.plan
    node_dir = eval_dir(results_dir, server)
    out_dir = node_dir / "lm-eval"
    task_dir = out_dir / "task"
    task_dir.mkdir(parents=True, exist_ok=True)
    _write_items(task_dir / "shots.jsonl", shots)
    _write_items(task_dir / "scored.jsonl", items)
    config = task_config(task_dir / "shots.jsonl", task_dir / "scored.jsonl")
    (task_dir / f"{LM_EVAL_TASK}.yaml").write_text(
        yaml.safe_dump(config, sort_keys=False), encoding="utf-8"
    )
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(out_dir / "hf-home"),
        "OPENAI_API_KEY": "EMPTY",
    }
    started = time.perf_counter()
    done = subprocess.run(
        lm_eval_argv(base_url, model, plan, task_dir, out_dir / "output"),
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=RUN_TIMEOUT_S,
    )
    duration = time.perf_counter() - started
    (out_dir / "lm-eval.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise LmEvalError(
            f"lm-eval exited with code {done.returncode} (log {out_dir / 'lm-eval.log'}):\n{tail}"
        )
    found = sorted((out_dir / "output").rglob("results_*.json"))
    if not found:
        raise LmEvalError(f"lm-eval wrote no results_*.json under {out_dir / 'output'}")
    # As append_lm_eval_summary: lm-eval's json/jsonl files move up into the eval workspace.
    for produced in (out_dir / "output").rglob("*.json*"):
        shutil.copy(produced, node_dir / produced.name)
    results_file = node_dir / found[-1].name
    data = json.loads(results_file.read_text(encoding="utf-8"))
    task = data.get("results", {}).get(LM_EVAL_TASK, {})
    n = int(data.get("n-samples", {}).get(LM_EVAL_TASK, {}).get("effective", len(items)))
    scores = tuple(
        FilterScore(
            name,
            float(task[f"{METRIC},{name}"]),
            float(task.get(f"{METRIC}_stderr,{name}", 0.0)),
            n,
        )
        for name in ("strict-match", "flexible-extract")
        if f"{METRIC},{name}" in task
    )
    return EvalResult(TASK, server.model_prefix, CHAT_ENDPOINT, n, scores, 0, "", duration,
                      plan.concurrency, results_file, plan)
