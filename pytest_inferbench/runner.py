"""The body of every benchmark item: run the point, record the result, apply the gates."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Protocol

import pytest

from .backends.base import ServerDiedError
from .state import RESULT_KEY, get_session_state

if TYPE_CHECKING:
    from pathlib import Path

    from .backends.base import ServerHandle
    from .launch import ServerSpec
    from .recipe import BenchPoint


class RunningNode(Protocol):
    """A server node as its points see it (`collect.ServerNode`)."""

    name: str
    spec: ServerSpec | None
    handle: ServerHandle | None
    dead_reason: str | None


def result_path(results_dir: Path, nodeid: str) -> Path:
    """One JSON file per node id, named so it sorts with its server node."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "__", nodeid.replace("::", "__")).strip("_")
    return results_dir / "points" / f"{slug}.json"


def run_bench_item(item: pytest.Item, point: BenchPoint, node: RunningNode) -> None:
    from . import gates, report, results

    state = get_session_state(item.config)
    handle = node.handle
    if handle is None:  # setup failed; pytest already reported it, never reached in practice
        pytest.fail(f"{node.name}: server was not started", pytrace=False)
    try:
        measurement = handle.run_point(point, state.load)
    except ServerDiedError as exc:
        node.dead_reason = str(exc)
        pytest.fail(str(exc), pytrace=False)
    result = results.build_result(point, measurement, spec=node.spec,
                                  backend=state.settings.backend)
    result["nodeid"] = item.nodeid
    findings = gates.check_point(result, point, node.spec, state.settings)
    result.update({k: v for k, v in findings.fields.items() if k not in result})
    failures = [*results.measurement_failures(result), *findings.failures]
    result["gate_failures"] = failures
    results.write_json_atomic(result_path(state.settings.results_dir, item.nodeid), result)
    item.stash[RESULT_KEY] = result
    item.user_properties.extend(report.result_properties(result))
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)
