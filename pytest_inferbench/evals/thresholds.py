"""Eval thresholds in InferenceX format and the pass/fail gate (validate_scores.py semantics).

`evals/thresholds.json` next to the recipes: `{"default": {task: score}, "models": {prefix:
{task: score}}}` (a flat `{task: score}` file is read as the default). Lookup:
`models[prefix][task]`, then `default[task]`, then 0.85. Every filter must pass.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..recipe.layout import Layout
    from ..recipe.model import ServerConfig
    from .runner import EvalResult

MIN_SCORE = 0.85


class ThresholdsError(Exception):
    """The thresholds file is malformed; the message names the file."""


def thresholds_path(server: ServerConfig, layout: Layout) -> Path:
    """InferenceX's `utils/evals/thresholds.json` in its checkout, else
    `<recipe dir>/evals/thresholds.json` (or where `inferbench_eval_thresholds` says)."""
    return layout.thresholds_for(Path(server.source))


@dataclass(frozen=True)
class Threshold:
    value: float
    source: str  # e.g. "models.dsr1 in benchmarks/evals/thresholds.json", "default 0.85"


def _scores(table: object, where: str) -> dict[str, float]:
    if not isinstance(table, dict):
        raise ThresholdsError(f"{where}: expected a mapping of task -> minimum score")
    out: dict[str, float] = {}
    for task, value in table.items():
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or not 0.0 <= value <= 1.0):
            raise ThresholdsError(f"{where}.{task}: expected a score within [0, 1], "
                                  f"got {value!r}")
        out[str(task)] = float(value)
    return out


def validate_thresholds(path: Path) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """The whole file read and checked: (default {task: score}, {prefix: {task: score}});
    `ThresholdsError` names the file and the key otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ThresholdsError(f"{path}: not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ThresholdsError(f"{path}: expected a JSON object")
    if "default" not in data and "models" not in data:
        data = {"default": data}  # legacy flat {task: score}
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise ThresholdsError(f"{path}: 'models' must map model prefixes to task scores")
    default = _scores(data.get("default", {}), f"{path}: default")
    return default, {str(prefix): _scores(table, f"{path}: models.{prefix}")
                     for prefix, table in models.items()}


def lookup_threshold(path: Path | None, model_prefix: str, task: str) -> Threshold:
    if path is None or not path.is_file():
        return Threshold(MIN_SCORE, f"built-in minimum {MIN_SCORE}")
    default, models = validate_thresholds(path)
    per_model = models.get(model_prefix, {})
    if task in per_model:
        return Threshold(per_model[task], f"models.{model_prefix} in {path}")
    if task in default:
        return Threshold(default[task], f"default in {path}")
    return Threshold(MIN_SCORE, f"built-in minimum {MIN_SCORE}")


def check_eval(result: EvalResult, threshold: Threshold) -> list[str]:
    """One line per failing filter (and for requests that never got an answer)."""
    failures: list[str] = []
    if result.failed_requests:
        failures.append(
            f"{result.task}: {result.failed_requests}/{result.n} requests failed "
            f"(first: {result.first_error})"
        )
    if not result.scores:
        failures.append(f"{result.task}: no scores were produced")
    for score in result.scores:
        if score.score < threshold.value:
            failures.append(
                f"{result.task} exact_match,{score.name} = {score.score:.4f} "
                f"± {score.stderr:.4f} (n={score.n}) < {threshold.value:g} ({threshold.source})"
            )
    return failures
