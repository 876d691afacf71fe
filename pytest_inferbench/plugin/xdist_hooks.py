"""pytest-xdist integration: each worker gets its own GPUs and Docker Engine.

The controller's `pytest_configure_node` writes into each worker's `workerinput`:
- `inferbench_run_id`: the controller's run id, so every container of the run shares a label;
- `inferbench_gpus`: a disjoint slice of `--inferbench-gpus` (equal shares, in worker order);
- `inferbench_docker_host`: one of `--inferbench-docker-hosts`, round robin by worker index.
The worker applies them with `state.worker_settings(settings, config.workerinput)`. Under
`--dist loadscope` the tree RecipeFile -> ServerNode -> point keeps every point of a server
node on one worker, so a node's server starts once, on that worker's GPUs.

plugin.py registers `XdistHooks` only when the xdist plugin is present. The controller collects
nothing itself, so it learns from the workers' collections whether the run has recipes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..backends.gpu import GpuSpecError, format_gpu_ids, parse_gpu_ids, split_between_workers
from ..state import DOCKER_HOST_KEY, GPUS_KEY, RUN_ID_KEY, get_session_state
from . import activation, preflight

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pytest
    from xdist.workermanage import WorkerController

    from ..options import Settings

__all__ = ["DOCKER_HOST_KEY", "GPUS_KEY", "RUN_ID_KEY", "XdistHooks", "register", "worker_input"]


def worker_index(workerid: str) -> int:
    """`gw3` -> 3."""
    return int(workerid.removeprefix("gw"))


def worker_input(settings: Settings, run_id: str, workerid: str, workercount: int
                 ) -> dict[str, str]:
    """What the controller hands one worker (pure, so it is testable without xdist)."""
    index = worker_index(workerid)
    values = {RUN_ID_KEY: run_id}
    if settings.gpus:
        # Errors must not kill the session inside xdist: a bad list goes to the workers as
        # given (each node's setup then fails with the parse error), too few GPUs for the
        # workers as an empty slice (each node fails naming the missing GPUs).
        try:
            ids = parse_gpu_ids(settings.gpus)
        except GpuSpecError:
            values[GPUS_KEY] = settings.gpus
        else:
            try:
                values[GPUS_KEY] = format_gpu_ids(split_between_workers(ids, workercount)[index])
            except GpuSpecError:
                values[GPUS_KEY] = ""
    if settings.docker_hosts:
        values[DOCKER_HOST_KEY] = settings.docker_hosts[index % len(settings.docker_hosts)]
    return values


class XdistHooks:
    """Hook implementations registered on the controller (and harmlessly on workers)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_configure_node(self, node: WorkerController) -> None:
        state = get_session_state(node.config)
        node.workerinput.update(worker_input(
            state.settings, state.run_id, str(node.workerinput["workerid"]),
            int(node.workerinput["workercount"])))

    def pytest_xdist_node_collection_finished(self, node: WorkerController,
                                              ids: Sequence[str]) -> None:
        config: pytest.Config = node.config
        state = get_session_state(config)
        activation.engage_for_node_ids(config, ids, state.settings)
        if not activation.run_begun(config) and not config.option.collectonly:
            # The first worker done collecting, before any worker runs a point: the files its
            # points will read, then the run's start.
            preflight.check_collected(preflight.servers_of_node_ids(
                config.rootpath, ids, state.settings.recipe_globs), state.settings)
        activation.begin_run(config, state.settings, state.run_id)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        activation.engage_for_report(self.config, report)


def register(config: pytest.Config) -> None:
    """Call from pytest_configure: registers XdistHooks when pytest-xdist is active."""
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(config), "inferbench-xdist")
