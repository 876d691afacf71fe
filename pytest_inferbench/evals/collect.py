"""The eval items of a server node: `eval-gsm8k`, `eval-gpqa`, `eval-swebench_lite`.

Which node gets which, following InferenceX's matrix logic (`mark_eval_entries`) and
`run_eval`: a fixed-seq-len node runs lm-eval's default task, GSM8K, and GPQA diamond where
the user asks for it (InferenceX runs it when `EVAL_TASKS_DIR` names its task file; here when
`--inferbench-eval-data` names GPQA data); a single-node agentic-coding node runs SWE-bench
Lite, which the plugin does not (its item skips with the reason), a multinode one none.

GSM8K is asked for when eval data is configured, `inferbench_eval_required` is set, or eval
thresholds are found (`utils/evals/thresholds.yaml` in InferenceX, `evals/thresholds.yaml` or
`.json` beside the recipes); without its data it skips with that reason, or fails when evals
are required.

InferenceX evaluates 8k1k rows at concurrency >= 16 only, the highest and the median in
separate jobs; here every node is evaluated once, on the server it was benchmarked on
(`runner.eval_point`). The generator's `--evals-only` is `-m eval` here, `--no-evals` is
`-m "not eval"`; its `agentic_evals` bucket is the skipped `eval-swebench_lite`, its
`multinode_evals` (one job per topology, at its highest concurrency >= 16) are multinode eval
items, skipped (not supported yet).

Eval items are the node's last, so they run against the same server after the points (and on
the same xdist worker under `--dist loadscope`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

import pytest

from ..options.eval_data import EVAL_DATA_TASKS, UNSUPPORTED_EVAL_TASKS
from ..state import get_session_state
from .tasks import TASK_NAMES
from .thresholds import ThresholdsError, read_thresholds, thresholds_path

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from ..backends.base import ServerHandle
    from ..options import Settings
    from ..recipe.launch import ServerSpec
    from ..recipe.model import ServerConfig


class EvalNode(Protocol):
    """The server node an eval item belongs to, as the item sees it (`collect.ServerNode`)."""

    name: str
    path: Path
    config: pytest.Config
    server: ServerConfig
    spec: ServerSpec | None
    handle: ServerHandle | None

EVAL_ITEM_NAME = "eval-gsm8k"
EVAL_MARKER = ("eval: accuracy eval item of a server node (GSM8K, GPQA); deselect with "
               "-m 'not eval'")
AGENTIC_TASK = "swebench_lite"  # what InferenceX's run_eval runs on agentic-coding rows


class EvalItem(pytest.Function):
    """One eval task against the node's server; a Function so -k/-m and fixtures work."""

    def __init__(self, *, task: str = "gsm8k", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.task = task  # the --inferbench-eval-data name: gsm8k, gpqa, swebench_lite
        self.add_marker(pytest.mark.eval)
        server = self.server_node.server
        if task in UNSUPPORTED_EVAL_TASKS:
            self.add_marker(pytest.mark.skip(
                reason=f"{task}: not supported: {UNSUPPORTED_EVAL_TASKS[task]}"))
        elif server.skip_reason:
            self.add_marker(pytest.mark.skip(reason=server.skip_reason))
        elif server.multinode:
            self.add_marker(pytest.mark.skip(reason="eval of a multinode server: not "
                                             "supported yet"))

    @property
    def server_node(self) -> EvalNode:
        assert self.parent is not None and hasattr(self.parent, "server")
        return cast("EvalNode", self.parent)

    def reportinfo(self) -> tuple[Path, int, str]:
        node = self.server_node
        return node.path, node.server.line - 1, f"{node.name}::{self.name}"


def wants_eval_item(config: pytest.Config, server: ServerConfig) -> bool:
    settings = get_session_state(config).settings
    return (
        settings.eval_data is not None
        or settings.eval_data_gpqa is not None
        or settings.eval_required
        or thresholds_path(server, settings.layout).is_file()
    )


def eval_tasks(config: pytest.Config, server: ServerConfig) -> list[str]:
    """The eval tasks of a node (by their --inferbench-eval-data names), in run order."""
    if not wants_eval_item(config, server):
        return []
    if server.scenario == "agentic-coding":
        # InferenceX runs no eval on a multinode agentic row.
        return [] if server.multinode else [AGENTIC_TASK]
    settings = get_session_state(config).settings
    return ["gsm8k", *(["gpqa"] if settings.eval_data_gpqa is not None else [])]


def make_eval_items(node: pytest.Collector, server: ServerConfig) -> list[EvalItem]:
    return [EvalItem.from_parent(node, name=f"eval-{task}", task=task, callobj=_eval_callobj())
            for task in eval_tasks(node.config, server)]


def threshold_tasks_not_run(settings: Settings) -> list[str]:
    """Header lines for the tasks the run's thresholds file names that no eval item here runs
    (nothing a threshold asks for is dropped silently)."""
    path = settings.layout.thresholds
    if path is None or not path.is_file():
        return []
    try:
        named = read_thresholds(path).tasks()
    except ThresholdsError:
        return []  # preflight reports the file
    run = {TASK_NAMES[t] for t in EVAL_DATA_TASKS}
    lines = []
    for task in sorted(named - run):
        why = UNSUPPORTED_EVAL_TASKS.get(task, "a task this plugin does not know")
        lines.append(f"inferbench: eval thresholds {path.name} names {task}: not run here ({why})")
    return lines


def _eval_callobj() -> Callable[[pytest.FixtureRequest], None]:
    def eval_task(request: pytest.FixtureRequest) -> None:
        """The item's eval task against this server node; every lm-eval filter must pass."""
        from .item import run_eval_item

        item = request.node
        assert isinstance(item, EvalItem)
        node = item.server_node
        state = get_session_state(item.config)
        if node.handle is None:
            pytest.fail(f"{node.name}: server was not started", pytrace=False)
        run_eval_item(
            item, node.server, node.spec, node.handle.base_url, state.settings,
            state.start_context, task=item.task,
        )

    return eval_task
