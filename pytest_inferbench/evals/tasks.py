"""The eval tasks the plugin runs: their `--inferbench-eval-data` names -> lm-eval task names
(the names results files, thresholds and validate_scores.py use)."""

from __future__ import annotations

from . import gpqa, gsm8k

TASK_NAMES = {"gsm8k": gsm8k.TASK, gpqa.DATA_KEY: gpqa.TASK}
