"""`SlurmBackend`: one allocation per server node, its processes as srun steps.

Why one allocation per server node (not one per xdist worker reused for all its nodes): each
node asks for its own GPU count (`--gres=gpu:<tp>`) as InferenceX's runners do, its time
limit covers one server, and a job that fails (time limit, preemption, node failure) takes
down that node's points only. The price is one salloc per node, small next to a model load.

Order of a start: the container image imported (before salloc, so no node idles through an
import), the allocation granted, the steps started with `srun --jobid`, then readiness on the
serving instance's health URL together with the steps' and the job's state.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from ...results.redact import Redactor
from .. import reaper
from ..base import Backend
from ..process import process_env
from ..readiness import log_path_for, startup_timeout
from ..simserver import engine_config, expect_simulated_error, sim_serve_argv
from . import commands, layout, pyxis
from .jobs import Allocation
from .steps import SlurmServer, StepLaunch

if TYPE_CHECKING:
    from ...options import SlurmSettings
    from ...recipe.launch import ServerSpec
    from ...recipe.model import ServerConfig
    from ..base import StartContext
    from ..supervised import SupervisedHandle


class SlurmBackend(Backend):
    name = "slurm"
    supports_roles = True

    def start(self, server: ServerConfig, spec: ServerSpec,
              ctx: StartContext) -> SupervisedHandle:
        settings: SlurmSettings = ctx.options.slurm
        redactor = Redactor.from_env(ctx.options.pass_env, urls=(ctx.options.base_url,))
        log_path = log_path_for(ctx.results_dir, server.node_name, ctx.worker_id,
                                ctx.log_paths)
        container: tuple[str, ...] = ()
        container_env: dict[str, str] = {}
        if settings.container:
            squash = pyxis.ensure_squash(spec.image, settings.squash_dir,
                                         log_path.with_suffix(".enroot.log"))
            container, container_env = pyxis.container_args(squash, settings, spec.mounts,
                                                            os.environ)
        allocation = Allocation(
            settings, name=commands.job_name(ctx.run_id, ctx.worker_id, server.node_name),
            comment=commands.job_comment(reaper.owner_label(), ctx.run_id, settings.comment),
            nodes=layout.nodes_needed(spec), gpus_per_node=spec.gpu_count,
            queue_timeout_s=startup_timeout(spec.startup_timeout_s,
                                            ctx.options.startup_timeout_s))
        simulated = settings.sim and not spec.roles
        # What the simulator will read, from the framework's argv before it is wrapped.
        config = engine_config(server, spec, None) if simulated else None
        if simulated:
            spec = dataclasses.replace(spec, argv=sim_serve_argv(
                server.hardware, ctx.options.time_scale, spec.argv))
        try:
            allocation.request()
            instances = layout.place(spec, allocation.hosts)
            launches = [step_launch(allocation.job_id, i, spec, container, container_env,
                                    ctx.options.pass_env)
                        for i in instances]
            supervised = SlurmServer(server.node_name, allocation, launches, log_path,
                                     redactor)
        except BaseException:
            allocation.cancel()
            raise
        from ..supervised import start_supervised

        serving = layout.serving(instances, spec)
        handle = start_supervised(supervised, base_url=f"http://{serving.address}", spec=spec,
                                  ctx=ctx)
        if config is not None:
            expect_simulated_error(handle, config)
        return handle


def step_launch(job_id: str, instance: layout.Instance, spec: ServerSpec,
                container: tuple[str, ...], container_env: dict[str, str],
                pass_env: tuple[str, ...] = ()) -> StepLaunch:
    """srun argv and environment of one instance. The environment travels through srun's own
    (`--export=ALL`), so no value is written on a command line."""
    env = {**process_env(spec, pass_env), **dict(instance.env), **container_env}
    argv = commands.srun_argv(job_id, instance.host, instance.argv, container=container,
                              extra=instance.srun_args)
    return StepLaunch(label=instance.label, argv=argv, env=env)

