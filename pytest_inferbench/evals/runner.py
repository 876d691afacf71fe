"""Run GSM8K against a served model as InferenceX's `run_eval` does, and score it.

- Always the chat endpoint with the server's chat template, for every node (InferenceX runs
  lm-eval's `local-chat-completions --apply_chat_template`, spec-decoding or not).
- Greedy decoding (temperature 0, top_p 1) and `max_tokens` from the eval context length as
  `run_lm_eval` computes it: context `ctx` = the server's `--max-model-len` (or
  `--context-length`) from the launch argv, else the eval point's max-model-len
  (`recipe.model.max_model_len`), capped at the model's native maximum when its config is on
  this machine; `max_tokens` = ctx - 4096 when ctx > 4096, else ctx / 2, at most 16384.
- Which point, at which concurrency (InferenceX's `mark_eval_entries`): evals run at 8k1k, at
  concurrency >= 16, with `num_concurrent` = that concurrency. InferenceX evaluates the highest
  and the median eligible concurrency in separate jobs; a node here is evaluated once, against
  the server it was benchmarked on, at the highest. A node without an eligible 8k1k point is
  still evaluated, at its highest concurrency, so every node gets an accuracy check.

Results and samples are written in lm-eval's layout (`results_<ts>.json` with
`results.gsm8k["exact_match,strict-match"]`, ...) under `<results>/evals/<node>/`, beside the
`meta_env.json` that `evals/files.py` writes, so InferenceX's `validate_scores.py` and eval
collector read that directory as they read an eval job's workspace.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import httpx

from ..recipe.model import BenchPoint as BenchPointType
from ..recipe.model import max_model_len
from ..results.build import write_json_atomic
from ..sim.args import ArgvError, argv_value
from . import gpqa
from .gsm8k import (
    METRIC,
    NUM_FEWSHOT,
    STOP_CHAT,
    TASK,
    FilterScore,
    GsmItem,
    build_messages,
    sample_shots,
    score_responses,
    split_shots,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from ..options import Settings
    from ..recipe.launch import ServerSpec
    from ..recipe.model import BenchPoint, ServerConfig
    from ..results.record import JSONValue
    from .gpqa import GpqaDoc

CHAT_ENDPOINT = "/v1/chat/completions"
RETRIES = 5  # InferenceX passes max_retries=5 to lm-eval
REQUEST_TIMEOUT_S = 1800.0  # InferenceX passes timeout=1800 to lm-eval
EVAL_SEQ = (8192, 1024)  # InferenceX evaluates 8k1k points only
MIN_EVAL_CONC = 16
DEFAULT_EVAL_CONTEXT = 16384  # run_lm_eval's fallback EVAL_MAX_MODEL_LEN
OUTPUT_RESERVE = 4096
MAX_EVAL_OUTPUT = 16384
RESULTS_GLOB = "results*.json"  # what validate_scores.py reads


@dataclass(frozen=True)
class EvalPlan:
    """Where and how a node's eval runs (InferenceX's selection and budget)."""

    concurrency: int
    isl: int
    osl: int
    context_length: int
    max_tokens: int


def eval_point(target: ServerConfig | BenchPoint) -> tuple[int, int, int]:
    """(concurrency, isl, osl) of the eval: the highest 8k1k concurrency >= 16, else the
    node's highest concurrency."""
    if isinstance(target, BenchPointType):
        return target.conc, target.isl, target.osl
    points = [(c, s.isl, s.osl) for s in target.sweeps for c in s.concurrencies]
    eligible = [p for p in points if (p[1], p[2]) == EVAL_SEQ and p[0] >= MIN_EVAL_CONC]
    return max(eligible or points, default=(1, *EVAL_SEQ))


def native_context_length(model: str) -> int | None:
    """The model's own maximum context from its local config (as InferenceX's
    get_native_max_context_length); None without transformers or the files."""
    try:
        from transformers import AutoConfig
    except ImportError:
        return None
    try:
        config = AutoConfig.from_pretrained(model, local_files_only=True, trust_remote_code=True)
    except Exception:  # no local config: no cap, as InferenceX when it prints 0
        return None
    for attr in ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def eval_max_tokens(context_length: int) -> int:
    """run_lm_eval: leave 4096 tokens for the prompt (half the context when it is smaller)."""
    budget = (context_length - OUTPUT_RESERVE if context_length > OUTPUT_RESERVE
              else context_length // 2)
    return min(budget, MAX_EVAL_OUTPUT)


def _server_of(target: ServerConfig | BenchPoint) -> ServerConfig:
    """The server an eval runs against: the node's, or the point's (a Python test's)."""
    return target.server if isinstance(target, BenchPointType) else target


def plan_eval(target: ServerConfig | BenchPoint, spec: ServerSpec | None) -> EvalPlan:
    conc, isl, osl = eval_point(target)
    server = _server_of(target)
    context = max_model_len(isl, osl)
    if spec is not None:
        try:
            launched = argv_value(spec.argv, "max_model_len")
        except ArgvError:
            launched = None
        context = launched if isinstance(launched, int) and launched else context
    native = native_context_length(server.model)
    if native is not None and context > native:
        context = native
    if context <= 0:
        context = DEFAULT_EVAL_CONTEXT
    return EvalPlan(conc, isl, osl, context, eval_max_tokens(context))


@dataclass(frozen=True)
class EvalResult:
    task: str
    model_prefix: str
    endpoint: str
    n: int
    scores: tuple[FilterScore, ...]
    failed_requests: int
    first_error: str
    duration_s: float
    concurrency: int
    results_file: Path | None = None
    plan: EvalPlan | None = None

    def score(self, filter_name: str) -> FilterScore | None:
        return next((s for s in self.scores if s.name == filter_name), None)

    def properties(self) -> list[tuple[str, object]]:
        """Builtin-typed pairs for JUnit properties."""
        props: list[tuple[str, object]] = [
            ("eval_task", self.task),
            ("eval_samples", self.n),
            ("eval_endpoint", self.endpoint),
        ]
        for s in self.scores:
            props += [
                (f"{METRIC},{s.name}", round(s.score, 4)),
                (f"{METRIC}_stderr,{s.name}", round(s.stderr, 4)),
            ]
        return props


def served_model(spec: ServerSpec | None, server: ServerConfig) -> str:
    return spec.served_model if spec else server.model


def eval_dir(results_dir: Path, server: ServerConfig, data_key: str = "gsm8k") -> Path:
    """A node's eval workspace for one task (GSM8K: `evals/<node>/`, others
    `evals/<node>-<task>/`: one task's results per directory, as one InferenceX eval job's
    workspace, so validate_scores.py judges a directory as the item judges its task); an
    earlier run's files there are removed first, as InferenceX removes `results*.json` and
    `sample*.jsonl` before a job (validate_scores globs them)."""
    name = server.node_name if data_key == "gsm8k" else f"{server.node_name}-{data_key}"
    out_dir = results_dir / "evals" / name
    for pattern in (RESULTS_GLOB, "samples_*.jsonl", "meta_env.json"):
        for stale in out_dir.glob(pattern):
            stale.unlink()
    return out_dir


@dataclass(frozen=True)
class EvalJob:
    """What both eval runners (builtin and lm-eval) start from: the node, the data, the plan."""

    server: ServerConfig
    shot_pool: list[GsmItem]  # the train split few-shot examples are drawn from
    items: list[GsmItem]  # the scored questions
    model: str  # the name the server serves
    plan: EvalPlan


def eval_job(target: ServerConfig | BenchPoint, spec: ServerSpec | None,
             settings: Settings) -> EvalJob:
    """Read the eval data and plan the eval; raises EvalDataError when the data is unusable."""
    if settings.eval_data is None:
        raise ValueError("an eval needs settings.eval_data")
    server = _server_of(target)
    pool, items = split_shots(settings.eval_data, settings.eval_limit)
    return EvalJob(server, pool, items, served_model(spec, server), plan_eval(target, spec))


def run_gsm8k_eval(base_url: str, job: EvalJob, results_dir: Path) -> EvalResult:
    """Evaluate the server at `base_url` with the builtin client and scorer."""
    items = job.items
    shots = sample_shots(job.shot_pool, len(items))
    chat = ChatEval(
        TASK, NUM_FEWSHOT,
        [build_messages(s, i.question) for s, i in zip(shots, items, strict=True)],
        STOP_CHAT, lambda responses: score_responses(items, responses),
        [{"question": i.question, "target": i.answer, "shots": [s.question for s in doc_shots]}
         for i, doc_shots in zip(items, shots, strict=True)],
        {"fewshot_split": "train"})
    return run_chat_eval(base_url, job.server, job.model, job.plan, chat,
                         eval_dir(results_dir, job.server))


@dataclass(frozen=True)
class GpqaJob:
    """A GPQA eval: the node, its documents (each question twice, answers shuffled), the plan."""

    server: ServerConfig
    docs: list[GpqaDoc]
    model: str
    plan: EvalPlan


def gpqa_job(target: ServerConfig | BenchPoint, spec: ServerSpec | None,
             settings: Settings) -> GpqaJob:
    """Read the GPQA data and plan the eval; raises EvalDataError when the data is unusable."""
    if settings.eval_data_gpqa is None:
        raise ValueError("a GPQA eval needs settings.eval_data_gpqa")
    server = _server_of(target)
    docs = gpqa.expand_docs(gpqa.load_rows(settings.eval_data_gpqa), settings.eval_limit)
    return GpqaJob(server, docs, served_model(spec, server), plan_eval(target, spec))


def run_gpqa_eval(base_url: str, job: GpqaJob, results_dir: Path) -> EvalResult:
    """GPQA diamond against the server at `base_url` with the builtin client and scorer."""
    docs = job.docs
    chat = ChatEval(
        gpqa.TASK, 0, [gpqa.build_messages(d) for d in docs], gpqa.STOP,
        lambda responses: gpqa.score_responses(docs, responses),
        [{"question": d.question, "choices": list(d.choices), "target": d.answer,
          "repeat_id": d.repeat} for d in docs],
        {"repeats": gpqa.REPEATS})
    return run_chat_eval(base_url, job.server, job.model, job.plan, chat,
                         eval_dir(results_dir, job.server, gpqa.DATA_KEY))


@dataclass(frozen=True)
class ChatEval:
    """One task's requests and scorer, as the builtin runner sends and scores them."""

    task: str
    num_fewshot: int
    conversations: list[list[dict[str, str]]]
    stop: tuple[str, ...]
    score: Callable[[list[str]], tuple[FilterScore, ...]]
    samples: list[dict[str, JSONValue]]  # each document's sample line, without the response
    config: dict[str, JSONValue]  # the task's own keys in the results file's `configs`


def run_chat_eval(base_url: str, server: ServerConfig, model: str, plan: EvalPlan,
                  chat: ChatEval, out_dir: Path) -> EvalResult:
    """Send every conversation, score the answers and write lm-eval's files to `out_dir`."""
    started = time.perf_counter()
    outcomes = asyncio.run(
        _ask_all(base_url.rstrip("/") + CHAT_ENDPOINT, model, chat, plan)
    )
    duration = time.perf_counter() - started
    responses = [text for text, _ in outcomes]
    errors = [err for _, err in outcomes if err]
    result = EvalResult(
        chat.task,
        server.model_prefix,
        CHAT_ENDPOINT,
        len(chat.conversations),
        chat.score(responses),
        len(errors),
        errors[0] if errors else "",
        duration,
        plan.concurrency,
        plan=plan,
    )
    results_file = _write_artifacts(out_dir, result, model, base_url, chat, responses)
    return replace(result, results_file=results_file)


async def _ask_all(url: str, model: str, chat: ChatEval, plan: EvalPlan
                   ) -> list[tuple[str, str]]:
    concurrency = plan.concurrency
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=30.0)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:

        async def ask(messages: list[dict[str, str]]) -> tuple[str, str]:
            async with gate:
                return await _ask(client, url, _payload(model, messages, plan.max_tokens,
                                                        chat.stop))

        return list(await asyncio.gather(*(ask(m) for m in chat.conversations)))


def _payload(model: str, messages: list[dict[str, str]], max_tokens: int,
             stop: tuple[str, ...]) -> dict[str, JSONValue]:
    """lm-eval's local-chat-completions request with InferenceX's --gen_kwargs."""
    return {
        "model": model,
        "messages": list(messages),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "top_p": 1.0,
        "stop": list(stop),
        "stream": False,
    }


async def _ask(
    client: httpx.AsyncClient, url: str, payload: dict[str, JSONValue]
) -> tuple[str, str]:
    """(generated text, error); transport errors and 5xx are retried like lm-eval does."""
    error = ""
    for attempt in range(RETRIES):
        try:
            response = await client.post(url, json=payload)
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        else:
            if response.status_code < 400:
                return _text(response.json()), ""
            error = f"HTTP {response.status_code}: {response.text[:200]}"
            if response.status_code < 500:
                break
        await asyncio.sleep(0.2 * (attempt + 1))
    return "", error


def _text(body: object) -> str:
    choices = body.get("choices") if isinstance(body, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        return ""
    # InferenceX's lm-eval patch: reasoning models may put everything in reasoning_content.
    return str(message.get("content") or message.get("reasoning_content") or "")


def _write_artifacts(out_dir: Path, result: EvalResult, model: str, base_url: str,
                     chat: ChatEval, responses: list[str]) -> Path:
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S")
    plan, task = result.plan, result.task
    task_results: dict[str, JSONValue] = {"alias": task}
    for s in result.scores:
        task_results[f"{METRIC},{s.name}"] = s.score
        task_results[f"{METRIC}_stderr,{s.name}"] = s.stderr
    data = {
        "results": {task: task_results},
        "n-shot": {task: chat.num_fewshot},
        "n-samples": {task: {"original": result.n, "effective": result.n}},
        "higher_is_better": {task: {METRIC: True}},
        "configs": {task: {"task": task, "num_fewshot": chat.num_fewshot,
                           "metric_list": [{"metric": METRIC}], **chat.config}},
        "config": {
            "model": "local-chat-completions",
            "model_args": {"model": model, "base_url": base_url + result.endpoint,
                           "num_concurrent": result.concurrency,
                           "max_length": plan.context_length if plan else None},
            "gen_kwargs": {"max_tokens": plan.max_tokens if plan else None,
                           "temperature": 0, "top_p": 1},
            "apply_chat_template": True,
            "runner": "pytest-inferbench builtin",
        },
        "failed_requests": result.failed_requests,
        "total_evaluation_time_seconds": round(result.duration_s, 3),
    }
    path = out_dir / f"results_{stamp}.json"
    write_json_atomic(path, data)
    samples = "".join(json.dumps({"doc_id": n, **sample, "response": r}) + "\n"
                      for n, (sample, r) in enumerate(zip(chat.samples, responses, strict=True)))
    (out_dir / f"samples_{task}_{stamp}.jsonl").write_text(samples, encoding="utf-8")
    return path
