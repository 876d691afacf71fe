"""Launch specs as data: `<prefix>_<precision>_<gpu>_<framework>.yaml`.

The package ships one spec per InferenceX single-node config (`pytest_inferbench/launch_specs/`,
written from InferenceX's server scripts), so a plugin installed anywhere, an InferenceX checkout
included, finds them. A local launch directory (`launch/` next to the recipe, or
`--inferbench-launch-dir`) overrides them file by file.

Resolving a server node gives one immutable `ServerSpec`: image, argv list, env, config files
the server reads (TensorRT-LLM's extra options YAML), port, GPU count, health path, startup
timeout and the client options. No shell strings anywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ..util import yamllines
from . import agentic
from .model import max_model_len
from .spec_values import LaunchSpecError as LaunchSpecError
from .spec_values import (
    check_keys,
    deep_merge,
    fill_placeholders,
    fill_placeholders_in,
    read_count,
    read_files,
    read_port,
    read_seconds,
    read_str_dict,
    read_str_list,
)

if TYPE_CHECKING:
    from .model import Parallelism, ServerConfig

PORT_PLACEHOLDER = "{port}"




@dataclass(frozen=True)
class ClientOptions:
    use_chat_template: bool = False
    endpoint: str = "/v1/completions"  # or /v1/chat/completions

    @property
    def chat(self) -> bool:
        return self.endpoint.rstrip("/").endswith("/chat/completions")

    @property
    def renders_template(self) -> bool:
        """The client renders the chat template into the prompt (InferenceX
        `--use-chat-template`); a chat endpoint templates on the server instead."""
        return self.use_chat_template and not self.chat

    @property
    def chat_framed(self) -> bool:
        """Prompts reach the model inside its chat template: rendered by the client, or by the
        server behind the chat endpoint (an agentic replay's)."""
        return self.use_chat_template or self.chat


@dataclass(frozen=True)
class RoleSpec:
    """One kind of process of a server made of several (e.g. workers and a router).

    Its argv may also hold `{host}` and `{port}` (this instance's), `{hosts:ROLE}` and
    `{addrs:ROLE}` (the comma-joined hostnames / host:port of every instance of ROLE), filled
    by the backend once it knows where each instance runs.
    """

    name: str
    count: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    srun_args: tuple[str, ...] = ()  # slurm backend: more srun words for this role's steps


@dataclass(frozen=True)
class ServerSpec:
    image: str
    argv: tuple[str, ...]  # may hold "{port}", filled by the backend when it picks the port
    env: tuple[tuple[str, str], ...]
    port: int
    health_path: str
    startup_timeout_s: float
    gpu_count: int
    served_model: str
    hardware: str
    framework: str
    client: ClientOptions
    launch_file: Path
    mounts: tuple[str, ...] = ()  # host:container[:ro|rw] bind mounts for the docker backend
    roles: tuple[RoleSpec, ...] = ()  # several processes (slurm backend); argv = serve role's
    serve_role: str = ""  # the role clients talk to, ready when it answers
    nodes: int = 0  # nodes to allocate for the roles (0: one per role instance)
    # Config files the server reads, relative to its working directory (name, YAML text).
    # The sim backend reads them; backends without `supports_files` refuse such a spec.
    files: tuple[tuple[str, str], ...] = ()
    # Where a user's own copy of this spec goes to override it (the local launch directory's
    # file of the node's name); the packaged file itself is not the user's to edit.
    override_file: Path | None = None
    # Where the client finds the served model's tokenizer (a local directory or hub name) when
    # the served name is not one (`--served-model-name`): "" means the served model itself.
    tokenizer: str = ""

    @property
    def tokenizer_source(self) -> str:
        """What the client loads the model's tokenizer from."""
        return self.tokenizer or self.served_model

    @property
    def user_file(self) -> Path:
        """The file a message tells the user to edit: the local override's path."""
        return self.override_file or self.launch_file

    @property
    def packaged(self) -> bool:
        return self.launch_file != self.user_file

    def argv_for_port(self, port: int) -> tuple[str, ...]:
        return tuple(a.replace(PORT_PLACEHOLDER, str(port)) for a in self.argv)

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


LAUNCH_KEYS = ("image", "command", "args", "env", "files", "mounts", "port", "health-path",
               "startup-timeout", "served-model", "client", "overlays", "roles", "serve-role",
               "nodes", "agentic", "tokenizer")
ROLE_KEYS = ("count", "command", "args", "env", "srun-args", "overlays", "settings")
# A multinode server's worker pools: a role of one of these names runs the recipe's workers of
# that pool (its count is their num-worker; `{tp}`, `{ep}`, `{gpus}` and its overlays are
# theirs). `decode.num-worker: 0` (aggregated) leaves the decode role out. Its `settings` map
# an additional-settings word of either pool (`CONFIG_FILE=recipes/...`) to the argv words that
# recipe file gives this role's workers, after the overlays' (the last value of a flag counts).
WORKER_ROLES = ("prefill", "decode")
# Packaged specs for multinode entries of a framework, whatever the model: the roles only.
MULTINODE_DIR = "multinode"
# Applied in this order: the parallel overlays, then speculative decoding, as the scripts put
# their PARALLEL_ARGS before their SPEC_ARGS. `dp-attn-ep` applies when DP attention and EP > 1
# go together (ATOM's scripts enable expert parallelism only then), before `dp-attn`'s words.
OVERLAY_NAMES = ("ep", "dp-attn-ep", "dp-attn", "mtp")
# The `agentic:` section's overlays: those, then decode context parallelism (`dcp-size` > 1),
# a branch InferenceX's agentic scripts take last (it may replace the speculative config).
AGENTIC_OVERLAY_NAMES = (*OVERLAY_NAMES, "dcp")
# An `args` word that marks where the active overlays' words go (at the end without it), so
# that a spec can keep a script's argv order: `-tp {tp} {overlays} --block-size ...`.
OVERLAY_ARGS_MARK = "{overlays}"
OVERLAY_KEYS = ("args", "env", "files", "client")
CLIENT_KEYS = ("use-chat-template", "endpoint")


def packaged_launch_dir() -> Path:
    """The launch specs shipped inside the package."""
    return Path(str(resources.files("pytest_inferbench").joinpath("launch_specs")))


def launch_spec_path(server: ServerConfig, launch_dir: Path) -> Path:
    """The local spec when there is one, else the packaged one (which may not exist either);
    a multinode server without either gets its framework's packaged multinode spec."""
    local = launch_dir / f"{server.launch_spec_name}.yaml"
    if local.is_file():
        return local
    packaged = packaged_launch_dir() / local.name
    if packaged.is_file():
        return packaged
    generic = packaged_launch_dir() / MULTINODE_DIR / f"{server.framework}.yaml"
    return generic if server.prefill is not None and generic.is_file() else local


def speculative_tokens(server: ServerConfig) -> int:
    """Drafted tokens of an MTP server as its recipe names them (`..._mtp3.yaml` in a worker's
    additional-settings, `-mtp2` in the config key), else 3 (assumption: the most common
    value in InferenceX's MTP recipes)."""
    words = [server.config_key]
    for worker in (server.prefill, server.decode):
        words += list(worker.additional_settings) if worker else []
    for word in words:
        found = re.search(r"mtp(\d+)", word.lower())
        if found and int(found.group(1)) > 0:
            return int(found.group(1))
    return 3


def resolve(server: ServerConfig, launch_dir: Path, *,
            startup_timeout_override: float | None = None) -> ServerSpec:
    """Read the node's launch spec and apply its overlays; raise LaunchSpecError naming the file."""
    path = launch_spec_path(server, launch_dir)
    override = launch_dir / f"{server.launch_spec_name}.yaml"
    if not path.is_file():
        raise LaunchSpecError(
            f"{server.node_name}: no launch spec for {server.config_key} "
            f"(looked for {path} and the packaged {packaged_launch_dir() / path.name}; "
            "expected <model-prefix>_<precision>_<gpu>_<framework>.yaml)")
    try:
        read = yamllines.to_python(yamllines.compose(yamllines.read_text(path))) or {}
    except yamllines.YamlSyntaxError as exc:
        raise LaunchSpecError(f"{path}: YAML syntax error at line {exc.line}: {exc.problem}"
                              ) from None
    data = check_keys(path, "", read, LAUNCH_KEYS)
    command = read_str_list(path, "command", data.get("command", []))
    args = read_str_list(path, "args", data.get("args", []))
    env = read_str_dict(path, "env", data.get("env", {}))
    mounts = tuple(read_str_list(path, "mounts", data.get("mounts", [])))
    for mount in mounts:
        parts = mount.split(":")
        if len(parts) not in (2, 3) or not all(parts[:2]) or parts[2:] not in ([], ["ro"], ["rw"]):
            raise LaunchSpecError(f"{path}: mounts: {mount!r} (expected host:container[:ro|rw])")
    files = read_files(path, "files", data.get("files", {}))
    client = check_keys(path, "client", data.get("client", {}), CLIENT_KEYS)
    on = _overlays_on(server.parallel, server)
    overlay_args, client = _apply_overlays(path, "overlays", data.get("overlays", {}), on, env,
                                           files, client)
    # An agentic point's server as InferenceX's agentic script starts it (a deployment of
    # roles keeps its workers' argv).
    how = agentic.read_agentic_launch(path, data.get("agentic", {}),
                                      AGENTIC_OVERLAY_NAMES).active(on)
    agentic_point = server.scenario == agentic.SCENARIO
    if agentic_point:
        client = {**client, "endpoint": agentic.REPLAY_ENDPOINT}
    if agentic_point and "roles" not in data:
        args, overlay_args = (agentic.server_words(words, how, server.framework,
                                                   OVERLAY_ARGS_MARK)
                              for words in (args, overlay_args))
        overlay_args += how.args
        env.update(how.env)
    # An agentic dram point's offload backend, sized from its DRAM budget (a deployment of
    # roles keeps its own argv: offload flags are not added to multinode workers).
    try:
        offload_args, offload_env, dropped = (
            agentic.offload_launch(server) if "roles" not in data else ([], {}, ()))
    except ValueError as exc:
        raise LaunchSpecError(f"{server.node_name}: {exc}") from None
    env.update(offload_env)
    args = [a for a in _place_overlay_args(path, args, overlay_args + offload_args)
            if a not in dropped]
    # A server node serves every ISL/OSL of its entry: its context is sized for the longest.
    context = max((max_model_len(s.isl, s.osl) for s in server.sweeps), default=32768)
    p = server.parallel
    values = {"{model}": server.model, "{tp}": str(p.tp), "{ep}": str(p.ep), "{gpus}": str(p.tp),
              "{pp}": str(p.pp), "{dcp}": str(p.dcp),
              "{max_model_len}": str(context),
              "{mtp_tokens}": str(speculative_tokens(server))}
    roles = _roles(path, data, command, env, values, server, files)
    # An agentic point runs at the model's native context: no ISL/OSL-sized context in the
    # config files (a deployment of roles' too).
    filled = {name: fill_placeholders_in(
        agentic.native_context_in(content) if agentic_point else content, values)
        for name, content in files.items()}
    serve_role = str(data.get("serve-role", "router")) if roles else ""
    if roles and serve_role not in {r.name for r in roles}:
        raise LaunchSpecError(f"{path}: serve-role: {serve_role!r} is not one of the roles "
                              f"({', '.join(r.name for r in roles)})")
    if not command and not roles:
        raise LaunchSpecError(f"{path}: command: empty (expected the server program as a list)")
    argv = (next(r.argv for r in roles if r.name == serve_role) if roles
            else tuple(fill_placeholders(a, values) for a in (*command, *args)))
    timeout = startup_timeout_override or read_seconds(path, data.get("startup-timeout", 1800))
    health_path = data.get("health-path", "/health")
    if not isinstance(health_path, str) or not health_path.startswith("/"):
        raise LaunchSpecError(f"{path}: health-path: {health_path!r} (expected a URL path "
                              "starting with '/', e.g. /health)")
    endpoint = client.get("endpoint", "/v1/completions")
    if not isinstance(endpoint, str) or not endpoint.startswith("/v1/") or not endpoint.rstrip(
            "/").endswith(("/completions", "/chat/completions")):
        raise LaunchSpecError(f"{path}: client.endpoint: {endpoint!r} (expected "
                              "/v1/completions or /v1/chat/completions)")
    tokenizer = data.get("tokenizer", "")
    if not isinstance(tokenizer, str):
        raise LaunchSpecError(f"{path}: tokenizer: {tokenizer!r} (expected a path or model name "
                              "the tokenizer is loaded from)")
    use_chat_template = client.get("use-chat-template", False)
    if not isinstance(use_chat_template, bool):
        raise LaunchSpecError(f"{path}: client.use-chat-template: "
                              f"{use_chat_template!r} (expected true or false)")
    return ServerSpec(
        image=str(data.get("image") or server.image),
        argv=argv,
        env=tuple(sorted(env.items())),
        port=read_port(path, data.get("port", 8888)),
        health_path=health_path,
        startup_timeout_s=timeout,
        gpu_count=server.gpus,
        served_model=fill_placeholders(str(data.get("served-model", "{model}")), values),
        hardware=server.hardware,
        framework=server.framework,
        client=ClientOptions(
            use_chat_template=use_chat_template,
            endpoint=endpoint,
        ),
        launch_file=path,
        mounts=mounts,
        roles=roles,
        serve_role=serve_role,
        nodes=read_count(path, "nodes", data.get("nodes", 0), minimum=0),
        files=tuple((fname, yaml.safe_dump(content, sort_keys=False))
                    for fname, content in filled.items()),
        override_file=override,
        tokenizer=fill_placeholders(tokenizer, values),
    )


def _place_overlay_args(path: Path, args: list[str], overlay_args: list[str]) -> list[str]:
    marks = [i for i, word in enumerate(args) if word == OVERLAY_ARGS_MARK]
    if not marks:
        return args + overlay_args
    if len(marks) > 1:
        raise LaunchSpecError(f"{path}: args: {OVERLAY_ARGS_MARK} given {len(marks)} times "
                              "(expected once: where the overlays' words go)")
    return args[:marks[0]] + overlay_args + args[marks[0] + 1:]


def _overlays_on(p: Parallelism, server: ServerConfig) -> dict[str, bool]:
    return {"ep": p.ep > 1, "dp-attn-ep": p.dp_attn and p.ep > 1, "dp-attn": p.dp_attn,
            "mtp": server.spec_decoding == "mtp", "dcp": p.dcp > 1}


def _apply_overlays(path: Path, where: str, value: object, on: dict[str, bool],
                    env: dict[str, str], files: dict[str, dict[str, object]],
                    client: dict[str, object]) -> tuple[list[str], dict[str, object]]:
    """The active overlays' argv words; their env and files go into `env` and `files`."""
    overlays = check_keys(path, where, value, OVERLAY_NAMES)
    words: list[str] = []
    for name in (name for name in OVERLAY_NAMES if on[name]):
        overlay = check_keys(path, f"{where}.{name}", overlays.get(name, {}), OVERLAY_KEYS)
        words += read_str_list(path, f"{where}.{name}.args", overlay.get("args", []))
        env.update(read_str_dict(path, f"{where}.{name}.env", overlay.get("env", {})))
        for fname, content in read_files(path, f"{where}.{name}.files",
                                     overlay.get("files", {})).items():
            files[fname] = deep_merge(files.get(fname, {}), content)
        client = {**client, **check_keys(path, f"{where}.{name}.client",
                                          overlay.get("client", {}), CLIENT_KEYS)}
    return words, client


def _roles(path: Path, data: dict[str, object], command: list[str], env: dict[str, str],
           values: dict[str, str], server: ServerConfig, files: dict[str, dict[str, object]]
           ) -> tuple[RoleSpec, ...]:
    """The `roles:` form: each role's argv is its `command` (else the top-level one), its
    `args` and its active overlays' words; its env is the top-level env with the role's on
    top. The roles of a multinode server's pools (`WORKER_ROLES`) take their count, `{tp}`,
    `{ep}`, `{gpus}` and which overlays apply from that pool's workers."""
    if "roles" not in data:
        return ()
    roles = data["roles"]
    if not isinstance(roles, dict) or not roles:
        raise LaunchSpecError(f"{path}: roles: empty (expected role names with count and args)")
    if data.get("args"):
        raise LaunchSpecError(f"{path}: roles: give args per role; top-level args apply to "
                              "single-process servers only")
    # The client is the whole deployment's: top-level overlays may turn its options on (the
    # chat template under MTP, as InferenceX's multinode benchmarks do), nothing per process.
    overlays = data.get("overlays") or {}
    for name, overlay in overlays.items() if isinstance(overlays, dict) else ():
        extra = sorted(set(overlay) - {"client"}) if isinstance(overlay, dict) else []
        if extra:
            raise LaunchSpecError(f"{path}: overlays.{name}.{extra[0]}: with roles, top-level "
                                  "overlays set only client; give args, env and files per role")
    specs = []
    for name, body in roles.items():
        where = f"roles.{name}"
        role = check_keys(path, where, body, ROLE_KEYS)
        worker = getattr(server, str(name)) if name in WORKER_ROLES else None
        role_values, on = values, _overlays_on(server.parallel, server)
        count = read_count(path, f"{where}.count", role.get("count", 1))
        if worker is not None:
            if "count" in role:
                raise LaunchSpecError(f"{path}: {where}.count: the recipe's num-worker of the "
                                      f"{name} pool gives it (expected no count here)")
            if worker.num_worker == 0:
                continue
            count = worker.num_worker
            p = worker.parallel
            role_values = {**values, "{tp}": str(p.tp), "{ep}": str(p.ep), "{gpus}": str(p.gpus),
                           "{pp}": str(p.pp)}
            on = _overlays_on(p, server)
        role_env = {**env, **read_str_dict(path, f"{where}.env", role.get("env", {}))}
        extra, _ = _apply_overlays(path, f"{where}.overlays", role.get("overlays", {}), on,
                                   role_env, files, {})
        extra += _setting_args(path, where, role.get("settings", {}),
                               server if worker is not None else None)
        words = (read_str_list(path, f"{where}.command", role["command"]) if "command" in role
                 else command)
        words = words + read_str_list(path, f"{where}.args", role.get("args", [])) + extra
        if server.scenario == agentic.SCENARIO:
            # An agentic point's workers serve the model's native context, as the single-node
            # agentic servers do: the ISL/OSL sizing of `{max_model_len}` is fixed-seq-len's.
            words = agentic.native_context(words)
        if not words:
            raise LaunchSpecError(f"{path}: {where}: no command (give one here or at the top)")
        specs.append(RoleSpec(
            name=str(name), count=count,
            argv=tuple(fill_placeholders(w, role_values) for w in words),
            env=tuple(sorted(role_env.items())),
            srun_args=tuple(read_str_list(path, f"{where}.srun-args", role.get("srun-args", [])))))
    return tuple(specs)


def _setting_args(path: Path, where: str, settings: object, server: ServerConfig | None
                  ) -> list[str]:
    """A worker role's words from the recipe files its server's pools name (none off a pool)."""
    if not isinstance(settings, dict):
        raise LaunchSpecError(f"{path}: {where}.settings: expected a mapping")
    # A recipe file configures the whole deployment, whichever pool's settings name it.
    pools = (server.prefill, server.decode) if server is not None else ()
    named = [w for pool in pools if pool is not None for w in pool.additional_settings]
    words: list[str] = []
    for word in dict.fromkeys(named):
        if word in settings:
            setting = check_keys(path, f"{where}.settings.{word}", settings[word], ("args",))
            words += read_str_list(path, f"{where}.settings.{word}.args", setting.get("args", []))
    return words
