"""`--inferbench-eval-runner lm-eval`: EleutherAI lm-evaluation-harness against the server.

The task is written next to the results as `gsm8k_inferbench.yaml`: InferenceX's gsm8k.yaml
(prompt, stop strings, both filters, exact_match settings) over local jsonl files, with the
same shots and scored items as the builtin runner (`split_shots`, `first_n` sampler), so both
runners score the same server responses the same way. lm-eval runs as a subprocess (argv list)
with the HF hub offline; its `results_*.json` feeds the same threshold gate.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import yaml

from ..recipe import BenchPoint
from .gsm8k import (
    FILTERS,
    METRIC,
    NUM_FEWSHOT,
    REGEXES_TO_IGNORE,
    STOP_CHAT,
    STOP_COMPLETIONS,
    TASK,
    FilterScore,
    GsmItem,
    doc_to_text,
    split_shots,
)
from .runner import MAX_TOKENS, REQUEST_TIMEOUT_S, EvalResult, client_setup, eval_concurrency

if TYPE_CHECKING:
    from pathlib import Path

    from ..launch import ServerSpec
    from ..options import Settings
    from ..recipe import ServerConfig

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


def task_config(shots_file: Path, scored_file: Path, chat: bool) -> dict[str, Any]:
    return {
        "task": LM_EVAL_TASK,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"train": str(shots_file), "test": str(scored_file)}},
        "output_type": "generate_until",
        "training_split": "train",
        "fewshot_split": "train",
        "test_split": "test",
        "num_fewshot": NUM_FEWSHOT,
        "fewshot_config": {"sampler": "first_n"},
        "doc_to_text": doc_to_text("{{question}}"),
        "doc_to_target": "{{answer}}",
        "target_delimiter": " ",
        "fewshot_delimiter": "\n\n",
        "generation_kwargs": {
            "until": list(STOP_CHAT if chat else STOP_COMPLETIONS),
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
    base_url: str,
    endpoint: str,
    model: str,
    chat: bool,
    concurrency: int,
    task_dir: Path,
    output_dir: Path,
) -> list[str]:
    model_args = ",".join(
        [
            f"model={model}",
            f"base_url={base_url.rstrip('/')}{endpoint}",
            f"num_concurrent={concurrency}",
            "max_retries=3",
            f"timeout={REQUEST_TIMEOUT_S:g}",
            "tokenized_requests=False",
            "tokenizer_backend=None",
        ]
    )
    argv = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "local-chat-completions" if chat else "local-completions",
        "--model_args",
        model_args,
        "--tasks",
        LM_EVAL_TASK,
        "--include_path",
        str(task_dir),
        "--gen_kwargs",
        f"max_gen_toks={MAX_TOKENS},temperature=0",
        "--batch_size",
        "1",
        "--output_path",
        str(output_dir),
        "--log_samples",
    ]
    return [*argv, "--apply_chat_template"] if chat else argv


def run_lm_eval(
    base_url: str,
    spec: ServerSpec | None,
    target: ServerConfig | BenchPoint,
    settings: Settings,
    results_dir: Path,
) -> EvalResult:
    if not lm_eval_available():
        raise LmEvalError(
            "--inferbench-eval-runner lm-eval needs lm-eval installed: "
            "pip install 'pytest-inferbench[lm-eval]'"
        )
    if settings.eval_data is None:
        raise ValueError("run_lm_eval needs settings.eval_data")
    server = target.server if isinstance(target, BenchPoint) else target
    shots, items = split_shots(settings.eval_data, settings.eval_limit)
    chat, endpoint, model = client_setup(spec, server)
    concurrency = eval_concurrency(target)
    out_dir = results_dir / "evals" / server.node_name / "lm-eval"
    task_dir = out_dir / "task"
    task_dir.mkdir(parents=True, exist_ok=True)
    _write_items(task_dir / "shots.jsonl", shots)
    _write_items(task_dir / "scored.jsonl", items)
    config = task_config(task_dir / "shots.jsonl", task_dir / "scored.jsonl", chat)
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
        lm_eval_argv(base_url, endpoint, model, chat, concurrency, task_dir, out_dir / "output"),
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
    data = json.loads(found[-1].read_text(encoding="utf-8"))
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
    return EvalResult(
        TASK, server.model_prefix, endpoint, n, scores, 0, "", duration, concurrency, found[-1]
    )
