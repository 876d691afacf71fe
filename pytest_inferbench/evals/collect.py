"""The `eval-gsm8k` item of a server node.

A node gets one when evals are asked for: eval data is configured (`--inferbench-eval-data` or
`inferbench_eval_data`), `inferbench_eval_required` is set, or the recipe directory defines
eval thresholds (`evals/thresholds.json`). It is the node's last item, so it runs against the
same server after the points (and on the same xdist worker under `--dist loadscope`). Without
data it skips with that reason, or fails when evals are required.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

import pytest

from ..state import get_session_state
from .thresholds import thresholds_path

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from ..backends.base import ServerHandle
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
EVAL_MARKER = "eval: accuracy eval item of a server node (GSM8K); deselect with -m 'not eval'"


class EvalItem(pytest.Function):
    """GSM8K against the node's server; a Function so -k/-m and fixtures work as usual."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_marker(pytest.mark.eval)
        server = self.server_node.server
        if server.skip_reason:
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
        or settings.eval_required
        or thresholds_path(server, settings.layout).is_file()
    )


def make_eval_item(node: pytest.Collector, server: ServerConfig) -> EvalItem | None:
    if not wants_eval_item(node.config, server):
        return None
    return EvalItem.from_parent(node, name=EVAL_ITEM_NAME, callobj=_eval_callobj())


def _eval_callobj() -> Callable[[pytest.FixtureRequest], None]:
    def eval_gsm8k(request: pytest.FixtureRequest) -> None:
        """GSM8K 5-shot against this server node; both lm-eval filters must pass."""
        from .item import run_eval_item

        item = request.node
        assert isinstance(item, EvalItem)
        node = item.server_node
        state = get_session_state(item.config)
        if node.handle is None:
            pytest.fail(f"{node.name}: server was not started", pytrace=False)
        run_eval_item(
            item, node.server, node.spec, node.handle.base_url, state.settings, state.start_context
        )

    return eval_gsm8k
