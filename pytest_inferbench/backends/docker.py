"""The `docker` backend: one container per server node, through the docker SDK only.

- The image is pulled before the startup clock starts (model-server images take minutes to
  pull); skipped when present or with `--inferbench-skip-pull`.
- The container runs the launch spec's argv exactly (entrypoint = argv[0], command = the
  rest; never a shell string), with host networking on a free port, env from the spec plus the
  host variables named by `--inferbench-pass-env` (values redacted everywhere we write), the
  Hugging Face cache mounted, labels `inferbench.{run,worker,node,owner}`, and a GPU preset
  when `gpu.preset_for_node` says so.
- Bind mounts (host:container[:ro|rw]) come from the launch spec's `mounts:` (per server: model
  directories) and from `INFERBENCH_DOCKER_MOUNTS` (comma-separated, every container of the run:
  the simulator image `simimage` borrows the host's Python).
- `--inferbench-docker-sim`: every container is of the local simulator image (`simimage`,
  built here on demand, never pulled) and runs the simulator with the launch spec's argv, as
  the sim-server backend does (`simserver.sim_serve_argv`), with the host paths it needs
  mounted read-only, no GPU and none of the launch spec's mounts; labels, host networking,
  health, logs and teardown are the real ones. Its numbers are simulated and say so (the
  simulator's response header).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..results.redact import Redactor
from . import gpu, reaper, simimage
from .base import Backend, ServerStartError
from .readiness import LogPump, free_port, log_path_for
from .reaper import make_client
from .simserver import engine_config, expect_simulated_error, sim_serve_argv

if TYPE_CHECKING:
    from collections.abc import Mapping

    from docker import DockerClient
    from docker.models.containers import Container as DockerContainer

    from ..recipe.launch import ServerSpec
    from ..recipe.model import ServerConfig
    from .base import StartContext
    from .supervised import SupervisedHandle

MOUNTS_ENV = "INFERBENCH_DOCKER_MOUNTS"
CONTAINER_HF_CACHE = "/root/.cache/huggingface/hub"


def server_address(docker_host: str | None) -> str:
    """Where a host-network container's server is reached from here: the engine's machine.

    A local engine (socket, None) shares this machine's loopback; a remote one
    (tcp://gpu-box-3:2376, ssh://ci@gpu-box-3) serves on that box's address, so its launch
    spec must bind an address reachable from here.
    """
    if not docker_host:
        return "127.0.0.1"
    parsed = urlsplit(docker_host)
    if parsed.scheme in ("unix", "npipe", "") or not parsed.hostname:
        return "127.0.0.1"
    return parsed.hostname


def parse_mounts(text: str, source: str = MOUNTS_ENV) -> dict[str, dict[str, str]]:
    """`/a:/b:ro,/c:/c` -> docker SDK volumes; read-only unless `:rw` is given."""
    volumes: dict[str, dict[str, str]] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        parts = entry.split(":")
        if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
            raise ServerStartError(f"{source}: {entry!r} is not host:container[:ro|rw]")
        mode = parts[2] if len(parts) == 3 else "ro"
        if mode not in ("ro", "rw"):
            raise ServerStartError(f"{source}: {entry!r}: mode must be ro or rw")
        volumes[parts[0]] = {"bind": parts[1], "mode": mode}
    return volumes


def host_hf_hub(environ: Mapping[str, str]) -> str | None:
    """The host's Hugging Face hub cache (HF_HUB_CACHE, else HF_HOME/hub), when it exists:
    a container engine would otherwise create the mount source root-owned."""
    hub = environ.get("HF_HUB_CACHE") or str(
        Path(environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub")
    return hub if Path(hub).is_dir() else None


def hf_cache_mount(environ: dict[str, str]) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """The host's HF hub cache mounted read-write (downloads persist)."""
    hub = host_hf_hub(environ)
    if hub is None:
        return {}, {}
    return {hub: {"bind": CONTAINER_HF_CACHE, "mode": "rw"}}, {"HF_HUB_CACHE": CONTAINER_HF_CACHE}


def container_name(ctx: StartContext, node: str, port: int) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", node).strip("-.") or "server"
    return f"inferbench-{ctx.run_id[:8]}-{ctx.worker_id}-{slug}"[:100] + f"-{port}"


def ensure_image(client: DockerClient, image: str, skip_pull: bool, redactor: Redactor) -> None:
    import docker.errors

    try:
        client.images.get(image)
        return
    except docker.errors.ImageNotFound:
        if skip_pull:
            raise ServerStartError(
                f"image {image} is not present and --inferbench-skip-pull forbids pulling it"
            ) from None
    except docker.errors.APIError as exc:  # e.g. an invalid reference such as upper case
        raise ServerStartError(f"image {image}: {redactor.text(str(exc))}") from None
    repository, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
    try:
        client.images.pull(repository, tag=tag or "latest")
    except docker.errors.APIError as exc:
        raise ServerStartError(
            f"cannot pull image {image}: {redactor.text(str(exc))}") from None


class Container:
    """A started container: state, streamed log, idempotent stop-and-remove."""

    def __init__(self, name: str, client: DockerClient, container: DockerContainer,
                 log_path: Path,
                 redactor: Redactor) -> None:
        self.name = name
        self.client = client
        self.container = container
        self.log = LogPump(container.logs(stream=True, follow=True), log_path, redactor)

    def exit_code(self) -> int | None:
        import docker.errors

        try:
            self.container.reload()
        except docker.errors.NotFound:
            return -1  # removed behind our back (docker rm -f): it is not serving
        if self.container.status in ("exited", "dead"):
            return int(self.container.attrs["State"]["ExitCode"])
        return None

    def exit_detail(self) -> str:
        return ""

    def terminate(self) -> None:
        try:
            reaper.stop_container(self.container)
        finally:
            self.client.close()


class DockerBackend(Backend):
    name = "docker"

    def start(self, server: ServerConfig, spec: ServerSpec,
              ctx: StartContext) -> SupervisedHandle:
        import docker.errors

        settings = ctx.options
        redactor = Redactor.from_env(settings.pass_env, urls=(settings.base_url,))
        engine = settings.docker_host or os.environ.get("DOCKER_HOST")
        try:
            client = make_client(settings.docker_host)
        except docker.errors.DockerException as exc:
            raise ServerStartError(
                f"no Docker Engine answers at {settings.docker_host or 'DOCKER_HOST/local socket'}"
                f": {redactor.text(str(exc))}") from None
        try:
            if settings.docker_sim:
                image = sim_image(client, engine, redactor)
            else:
                image = spec.image
                ensure_image(client, image, settings.skip_pull, redactor)
            port = free_port()
            container = create_and_start(client, image, run_kwargs(server, spec, ctx, port),
                                         server.node_name, redactor)
        except BaseException:
            client.close()
            raise
        from .supervised import start_supervised

        log_path = log_path_for(ctx.results_dir, server.node_name, ctx.worker_id,
                                ctx.log_paths)
        handle = start_supervised(Container(server.node_name, client, container, log_path,
                                            redactor),
                                  base_url=f"http://{server_address(engine)}:{port}",
                                  spec=spec, ctx=ctx)
        if settings.docker_sim:
            expect_simulated_error(handle, engine_config(server, spec, None))
        return handle


def sim_image(client: DockerClient, engine: str | None, redactor: Redactor) -> str:
    """The simulator image for `--inferbench-docker-sim`, built on this engine when missing.
    It borrows this machine's Python through bind mounts, so the engine must be this one."""
    import docker.errors

    if server_address(engine) != "127.0.0.1":
        raise ServerStartError(
            f"--inferbench-docker-sim needs a local Docker Engine (the simulator image mounts "
            f"this machine's Python), not {redactor.text(engine or '')}")
    try:
        return simimage.ensure_image(client)
    except docker.errors.APIError as exc:
        raise ServerStartError(f"--inferbench-docker-sim: cannot build {simimage.IMAGE}: "
                               f"{redactor.text(str(exc))}") from None


def create_and_start(client: DockerClient, image: str, kwargs: Mapping[str, object], node: str,
                     redactor: Redactor) -> DockerContainer:
    """Create, then start: a container whose start fails is removed, not left `Created`."""
    import docker.errors

    try:
        container = client.containers.create(image, **kwargs)
    except docker.errors.APIError as exc:
        raise ServerStartError(f"server {node}: docker could not create a container of "
                               f"{image}: {redactor.text(str(exc))}") from None
    try:
        container.start()
    except BaseException as exc:
        reaper.stop_container(container, grace_s=0)
        if isinstance(exc, docker.errors.APIError):
            raise ServerStartError(f"server {node}: docker could not start {image}: "
                                   f"{redactor.text(str(exc))}") from None
        raise
    return container


def run_kwargs(server: ServerConfig, spec: ServerSpec, ctx: StartContext,
               port: int) -> dict[str, object]:
    """Everything for containers.run besides the image; argv stays a list end to end."""
    settings = ctx.options
    argv = spec.argv_for_port(port)
    environ = dict(os.environ)
    volumes, cache_env = hf_cache_mount(environ)
    if settings.docker_sim:
        # The simulator reads no model directory: a spec's mounts (often paths of the GPU box
        # only) are left out, so the flow can be tried where they do not exist.
        argv = sim_serve_argv(server.hardware, settings.time_scale, argv)
        volumes.update(parse_mounts(simimage.mounts_value(), source="--inferbench-docker-sim"))
    else:
        volumes.update(parse_mounts(",".join(spec.mounts), source=str(spec.launch_file)))
    volumes.update(parse_mounts(environ.get(MOUNTS_ENV, "")))
    passed = {name: environ[name] for name in settings.pass_env if name in environ}
    env = {**cache_env, **spec.env_dict, **passed,
           **(simimage.container_env() if settings.docker_sim else {})}
    kwargs: dict[str, object] = {}
    try:
        # The simulator computes on the CPU: no GPU is exposed, so none need be present.
        preset = None if settings.docker_sim else gpu.preset_for_node(
            spec.hardware, spec.gpu_count, settings.gpus, server.node_name)
    except gpu.GpuSpecError as exc:
        raise ServerStartError(str(exc)) from None
    if preset is not None:
        kwargs = preset.docker_kwargs()
        gpu_env = kwargs.pop("environment", {})
        env.update(gpu_env if isinstance(gpu_env, dict) else {})
    return {
        **kwargs,
        "entrypoint": list(argv[:1]),
        "command": list(argv[1:]),
        "environment": env,
        "volumes": volumes,
        "network_mode": "host",
        "init": True,  # forwards SIGTERM to servers that run as PID 1 without a handler
        "name": container_name(ctx, server.node_name, port),
        "labels": {
            reaper.LABEL_RUN: ctx.run_id,
            reaper.LABEL_WORKER: ctx.worker_id,
            reaper.LABEL_NODE: server.node_name,
            reaper.LABEL_OWNER: reaper.owner_label(),
        },
    }
