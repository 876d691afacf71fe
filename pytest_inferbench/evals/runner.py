"""Run GSM8K against a served model over its OpenAI API, concurrently, and score it.

Chat or completions follows the launch spec's client options (InferenceX runs evals on chat;
a spec-decode spec sets use-chat-template, so its eval also uses chat). Greedy decoding
(temperature 0, top_p 1), like InferenceX's `--gen_kwargs`. Results and samples are written in
lm-eval's layout (`results_<ts>.json` with `results.gsm8k["exact_match,strict-match"]`, ...)
under `<results>/evals/<node>/`, so tools that read lm-eval output read these too.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from ..recipe import BenchPoint as BenchPointType
from ..results import write_json_atomic
from .gsm8k import (
    METRIC,
    NUM_FEWSHOT,
    STOP_CHAT,
    STOP_COMPLETIONS,
    TASK,
    FilterScore,
    GsmItem,
    build_messages,
    build_prompt,
    score_responses,
    split_shots,
)

if TYPE_CHECKING:
    from pathlib import Path

    from ..launch import ServerSpec
    from ..options import Settings
    from ..recipe import BenchPoint, ServerConfig

MAX_TOKENS = 2048
MAX_CONCURRENCY = 64
RETRIES = 3
REQUEST_TIMEOUT_S = 1800.0  # InferenceX passes timeout=1800 to lm-eval


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


def eval_concurrency(target: ServerConfig | BenchPoint) -> int:
    if isinstance(target, BenchPointType):
        return target.conc
    highest = max((c for s in target.sweeps for c in s.concurrencies), default=1)
    return max(1, min(highest, MAX_CONCURRENCY))


def client_setup(spec: ServerSpec | None, server: ServerConfig) -> tuple[bool, str, str]:
    """(chat?, endpoint path, model name) as the launch spec's client options say."""
    chat = spec is not None and (spec.client.use_chat_template or "chat" in spec.client.endpoint)
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    return chat, endpoint, spec.served_model if spec else server.model


def run_gsm8k_eval(
    base_url: str,
    spec: ServerSpec | None,
    target: ServerConfig | BenchPoint,
    settings: Settings,
    results_dir: Path,
) -> EvalResult:
    """Evaluate the server at `base_url`; raises EvalDataError when the data is unusable."""
    if settings.eval_data is None:
        raise ValueError("run_gsm8k_eval needs settings.eval_data")
    server = target.server if isinstance(target, BenchPointType) else target
    shots, items = split_shots(settings.eval_data, settings.eval_limit)
    chat, endpoint, model = client_setup(spec, server)
    concurrency = eval_concurrency(target)
    started = time.perf_counter()
    outcomes = asyncio.run(
        _ask_all(base_url.rstrip("/") + endpoint, model, chat, shots, items, concurrency)
    )
    duration = time.perf_counter() - started
    responses = [text for text, _ in outcomes]
    errors = [err for _, err in outcomes if err]
    scores = score_responses(items, responses)
    result = EvalResult(
        TASK,
        server.model_prefix,
        endpoint,
        len(items),
        scores,
        len(errors),
        errors[0] if errors else "",
        duration,
        concurrency,
    )
    out_dir = results_dir / "evals" / server.node_name
    results_file = _write_artifacts(out_dir, result, model, base_url, items, responses)
    return EvalResult(**{**result.__dict__, "results_file": results_file})


async def _ask_all(
    url: str, model: str, chat: bool, shots: list[GsmItem], items: list[GsmItem], concurrency: int
) -> list[tuple[str, str]]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=30.0)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:

        async def ask(item: GsmItem) -> tuple[str, str]:
            async with gate:
                return await _ask(client, url, _payload(model, chat, shots, item.question), chat)

        return list(await asyncio.gather(*(ask(item) for item in items)))


def _payload(model: str, chat: bool, shots: list[GsmItem], question: str) -> dict[str, Any]:
    common: dict[str, Any] = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "top_p": 1.0,
        "stream": False,
    }
    if chat:
        return {**common, "messages": build_messages(shots, question), "stop": list(STOP_CHAT)}
    return {**common, "prompt": build_prompt(shots, question), "stop": list(STOP_COMPLETIONS)}


async def _ask(
    client: httpx.AsyncClient, url: str, payload: dict[str, Any], chat: bool
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
                return _text(response.json(), chat), ""
            error = f"HTTP {response.status_code}: {response.text[:200]}"
            if response.status_code < 500:
                break
        await asyncio.sleep(0.2 * (attempt + 1))
    return "", error


def _text(body: Any, chat: bool) -> str:
    try:
        choice = body["choices"][0]
        if chat:
            message = choice["message"]
            # InferenceX's lm-eval patch: reasoning models may put everything in reasoning_content.
            return str(message.get("content") or message.get("reasoning_content") or "")
        return str(choice.get("text") or "")
    except (KeyError, IndexError, TypeError):
        return ""


def _write_artifacts(
    out_dir: Path,
    result: EvalResult,
    model: str,
    base_url: str,
    items: list[GsmItem],
    responses: list[str],
) -> Path:
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S")
    task_results: dict[str, Any] = {"alias": TASK}
    for s in result.scores:
        task_results[f"{METRIC},{s.name}"] = s.score
        task_results[f"{METRIC}_stderr,{s.name}"] = s.stderr
    data = {
        "results": {TASK: task_results},
        "n-shot": {TASK: NUM_FEWSHOT},
        "n-samples": {TASK: {"original": result.n, "effective": result.n}},
        "higher_is_better": {TASK: {METRIC: True}},
        "config": {
            "model": model,
            "base_url": base_url + result.endpoint,
            "num_concurrent": result.concurrency,
            "runner": "pytest-inferbench builtin",
        },
        "failed_requests": result.failed_requests,
        "total_evaluation_time_seconds": round(result.duration_s, 3),
    }
    path = out_dir / f"results_{stamp}.json"
    write_json_atomic(path, data)
    samples = "".join(
        json.dumps({"question": i.question, "target": i.answer, "response": r}) + "\n"
        for i, r in zip(items, responses, strict=True)
    )
    (out_dir / f"samples_{TASK}_{stamp}.jsonl").write_text(samples, encoding="utf-8")
    return path
