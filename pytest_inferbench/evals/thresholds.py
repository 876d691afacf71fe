"""Eval thresholds in InferenceX's format and the pass/fail gate (validate_scores.py semantics).

InferenceX keeps them in `utils/evals/thresholds.yaml` (older checkouts: `thresholds.json`),
other projects in `evals/thresholds.yaml` or `.json` next to the recipes. Both are one mapping
`{"default": {task: score}, "models": {prefix: {task: score}}}`; a mapping with neither key is
the legacy flat form and is read as the default; `.json` is read as JSON, anything else as
YAML (validate_scores.py reads either). Lookup, for the task name the results carry
(`gsm8k`, `gpqa_diamond_cot_n_shot`, ...): `models[prefix][task]`, then `default[task]`, then
validate_scores.py's `--min-score` default 0.85. Every `exact_match,<filter>` must pass.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..util.yamllines import YamlSyntaxError, compose, to_python

if TYPE_CHECKING:
    from ..recipe.layout import Layout
    from ..recipe.model import ServerConfig
    from .runner import EvalResult

MIN_SCORE = 0.85  # validate_scores.py --min-score default: no file, or no entry for the task


class ThresholdsError(Exception):
    """The thresholds file is malformed; the message names the file and the key."""


def thresholds_path(server: ServerConfig, layout: Layout) -> Path:
    """The thresholds file the server's results are judged against (it may not exist)."""
    return layout.thresholds_for(Path(server.source))


@dataclass(frozen=True)
class Threshold:
    value: float
    source: str  # e.g. "models.dsr1 in utils/evals/thresholds.yaml", "built-in minimum 0.85"


@dataclass(frozen=True)
class Thresholds:
    """A thresholds file, read and checked."""

    default: dict[str, float]
    models: dict[str, dict[str, float]]

    def tasks(self) -> set[str]:
        """Every task name the file gives a score for."""
        return set(self.default).union(*self.models.values())


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


def read_thresholds(path: Path) -> Thresholds:
    """The whole file read and checked; `ThresholdsError` names the file (and line or key)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ThresholdsError(f"{path}: cannot read eval thresholds: {exc}") from None
    data: object
    if path.suffix.lower() == ".json":
        # Python's JSON reader: a deeply nested file is an error here, where libyaml crashes.
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ThresholdsError(f"{path}: not readable JSON: {exc}") from None
    else:
        try:
            data = to_python(compose(text))
        except YamlSyntaxError as exc:
            raise ThresholdsError(f"{path}:{exc.line}: {exc.problem}") from None
    if not isinstance(data, dict):
        raise ThresholdsError(f"{path}: expected a mapping with 'default' and/or 'models'")
    if "default" not in data and "models" not in data:
        data = {"default": data}  # legacy flat {task: score}
    models = data.get("models") or {}
    if not isinstance(models, dict):
        raise ThresholdsError(f"{path}: 'models' must map model prefixes to task scores")
    return Thresholds(
        _scores(data.get("default") or {}, f"{path}: default"),
        {str(prefix): _scores(table, f"{path}: models.{prefix}")
         for prefix, table in models.items()},
    )


def validate_thresholds(path: Path) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(default {task: score}, {prefix: {task: score}}) of the file (`read_thresholds`)."""
    read = read_thresholds(path)
    return read.default, read.models


def lookup_threshold(path: Path | None, model_prefix: str, task: str) -> Threshold:
    """The minimum score of `task` for `model_prefix`, as validate_scores.py resolves it."""
    if path is None or not path.is_file():
        return Threshold(MIN_SCORE, f"built-in minimum {MIN_SCORE}")
    read = read_thresholds(path)
    per_model = read.models.get(model_prefix, {}) if model_prefix else {}
    if task in per_model:
        return Threshold(per_model[task], f"models.{model_prefix} in {path}")
    if task in read.default:
        return Threshold(read.default[task], f"default in {path}")
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
