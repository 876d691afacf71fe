"""`--inferbench-eval-data` (and `inferbench_eval_data`): which eval task reads which file.

`PATH` alone is GSM8K's data, as it always was; `gsm8k=PATH,gpqa=PATH` names each task's file
(either may be left out). A task this plugin does not run is refused with the reason, so a
typo or an unsupported task never passes unnoticed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# The tasks that take data, by the names this option uses (the eval items are `eval-<name>`).
EVAL_DATA_TASKS = ("gsm8k", "gpqa")
# Tasks InferenceX runs that the plugin does not, and why; one place says it for every reader.
UNSUPPORTED_EVAL_TASKS = {
    "swebench_lite": "SWE-bench Lite applies each generated patch and runs the repository's "
                     "tests in sandboxes (Modal or Docker), which the plugin does not provide",
}


def parse_eval_data(text: str, where: str = "--inferbench-eval-data") -> dict[str, Path]:
    """{task: path}; `pytest.UsageError` names `where` for a malformed value."""
    text = text.strip()
    if not text:
        return {}
    key = text.split(",", 1)[0].partition("=")[0].strip()
    if key not in (*EVAL_DATA_TASKS, *UNSUPPORTED_EVAL_TASKS):
        return {"gsm8k": Path(text)}  # the single-path form: GSM8K
    out: dict[str, Path] = {}
    for part in text.split(","):
        task, sep, path = (s.strip() for s in part.partition("="))
        if task in UNSUPPORTED_EVAL_TASKS:
            raise pytest.UsageError(f"{where} {task}=...: not supported: "
                                    f"{UNSUPPORTED_EVAL_TASKS[task]}")
        if not sep or task not in EVAL_DATA_TASKS or not path:
            raise pytest.UsageError(
                f"{where} {text!r}: expected PATH (GSM8K) or TASK=PATH[,TASK=PATH] with TASK "
                f"one of {', '.join(EVAL_DATA_TASKS)}; got {part.strip()!r}")
        if task in out:
            raise pytest.UsageError(f"{where} {text!r}: {task} is given twice")
        out[task] = Path(path)
    return out
