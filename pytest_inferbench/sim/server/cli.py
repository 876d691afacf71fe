"""`python -m pytest_inferbench.sim serve [SIMULATOR OPTIONS] [--] <server argv>`.

The server argv is a real server's command line -- ATOM (`python3 -m
atom.entrypoints.openai_server ...`), vLLM (`vllm serve MODEL ...`) or SGLang (`python -m
sglang.launch_server ...`) -- handed over unchanged from a launch spec; `sim/args.py` reads
it into the engine configuration. Simulator options come first; the first word that is not a
simulator option (or everything after `--`) starts the server argv. The port comes from the
argv (`--server-port` / `--port`) unless `--port` is given before it; 0 picks a free port,
which `--port-file` reports. The server binds 127.0.0.1 unless `--host` says otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ...frameworks import registry
from ..disagg import ROUTER_POLICIES
from .faults import FaultConfig
from .oracle import OracleError
from .oracle_choice import load_oracle
from .prom import snapshot_from_engine
from .timeline import DEFAULT_BUDGET_MIB, MIB

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType

    from prometheus_client.registry import Collector

    from .app import ServeConfig
    from .engine_loop import EngineLike

PROG = "python -m pytest_inferbench.sim serve"
DEFAULT_PORT = 8000
DEFAULT_HARDWARE_ENV = "INFERBENCH_SIM_HARDWARE"
_SWITCHES = {"--never-ready"}
_VALUED = {"--hardware", "--persona", "--time-scale", "--seed", "--eval-oracle", "--calibration",
           "--eval-accuracy", "--fail-after-requests", "--error-rate", "--truncate-rate",
           "--startup-delay", "--stall-after-tokens", "--host", "--port", "--port-file",
           "--log-level", "--prefill-workers", "--decode-workers", "--router",
           "--timeline-mib"}
MAX_PORT = 65535
USAGE_EXIT = 2  # bad options or argv (argparse's status)
START_FAILED_EXIT = 1  # valid options, but the server could not start (port taken, ...)


class UsageError(Exception):
    """Bad simulator options or server argv; the message is printed, exit status 2."""


class StartError(Exception):
    """Valid options, but the server cannot start (its port cannot be bound); exit status 1."""


def _non_negative(text: str) -> float:
    """A finite number >= 0 (argparse type): `inf` would never end a step and `nan` compares
    with nothing, so both are refused with the usage, not served."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def port_number(text: str) -> int:
    """A TCP port 0-65535 (argparse type; 0 = any free port)."""
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_PORT:
        raise argparse.ArgumentTypeError(f"expected a port number 0-{MAX_PORT}, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, usage=f"{PROG} [SIMULATOR OPTIONS] [--] <server argv>",
        description="Serve the simulated engine over OpenAI-compatible HTTP. The numbers it "
                    "produces are simulated, not measured on any GPU.")
    p.add_argument("--hardware", default=os.environ.get(DEFAULT_HARDWARE_ENV, "MI355X"),
                   help=f"accelerator from the catalog (default ${DEFAULT_HARDWARE_ENV} or MI355X)")
    p.add_argument("--persona", choices=registry.personas(), default=None,
                   help="metric names and debug endpoints to mimic (default: the argv's program)")
    p.add_argument("--time-scale", type=_non_negative, default=1.0,
                   help="1.0 = real time, 0.5 = twice as fast, 0 = as fast as possible")
    p.add_argument("--seed", type=int, default=None, help="engine and fault seed (default 0)")
    p.add_argument("--calibration", type=Path, default=None, metavar="FILE",
                   help="price steps with this calibration file's knobs where it has an entry "
                        "for the server (`python -m pytest_inferbench.sim calibrate`)")
    p.add_argument("--eval-oracle", type=Path, default=None, metavar="FILE",
                   help="GSM8K jsonl or GPQA rows (.csv or jsonl): answer their questions "
                        "with --eval-accuracy")
    p.add_argument("--eval-accuracy", type=float, default=0.937, metavar="P",
                   help="probability an oracle answer is right, per question (default 0.937)")
    p.add_argument("--fail-after-requests", type=int, default=None, metavar="N",
                   help="exit once N completion requests have finished")
    p.add_argument("--error-rate", type=float, default=0.0, metavar="R",
                   help="answer this share of completion requests with HTTP 500")
    p.add_argument("--truncate-rate", type=float, default=0.0, metavar="R",
                   help="cut this share of streams after half their tokens, without [DONE]")
    p.add_argument("--never-ready", action="store_true", help="/health answers 503 forever")
    p.add_argument("--startup-delay", type=_non_negative, default=0.0, metavar="S",
                   help="/health answers 503 for S seconds after start")
    p.add_argument("--stall-after-tokens", type=int, default=None, metavar="N",
                   help="streams stop sending after N tokens and stay open")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=None,
                   help="port to bind, overriding the argv's (0 = any free port)")
    p.add_argument("--port-file", type=Path, default=None, metavar="FILE",
                   help="write the bound port to FILE once listening")
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    p.add_argument("--timeline-mib", type=_non_negative, default=DEFAULT_BUDGET_MIB,
                   metavar="MIB", help="memory for /debug/inferbench/timeline's records of "
                   f"finished requests; the oldest are dropped beyond it (default "
                   f"{DEFAULT_BUDGET_MIB:g})")
    p.add_argument("--prefill-workers", type=int, default=0, metavar="N",
                   help="serve a multinode deployment: N prefill workers, each running the "
                        "server argv (with --decode-workers 0: N aggregated workers)")
    p.add_argument("--decode-workers", type=int, default=0, metavar="M",
                   help="M decode workers; their argv follows a second `--` after the "
                        "prefill argv (else the same argv)")
    p.add_argument("--router", choices=ROUTER_POLICIES, default=None,
                   help="the deployment's router (default: the argv framework's, see "
                        "docs/simulator.md)")
    return p


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(simulator options, server argv): options until `--` or the first unknown word."""
    words = list(argv)
    i = 0
    while i < len(words):
        word = words[i]
        name = word.split("=", 1)[0]
        if word == "--":
            return words[:i], words[i + 1:]
        if name in _SWITCHES or word in ("-h", "--help"):
            i += 1
        elif name in _VALUED:
            i += 1 if "=" in word else 2
        else:
            break
    return words[:i], words[i:]


def flag_values(argv: Sequence[str], *names: str) -> list[str]:
    """Values of `--flag V...` / `--flag=V` in a server argv (all words up to the next flag)."""
    values: list[str] = []
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        if name not in names:
            continue
        if eq:
            values.append(value)
            continue
        for follower in argv[i + 1:]:
            if follower.startswith("-"):
                break
            values.append(follower)
    return values


def argv_port(server_argv: Sequence[str]) -> int:
    ports = flag_values(server_argv, "--server-port", "--port")
    if not ports:
        return DEFAULT_PORT
    if not (ports[-1].isascii() and ports[-1].isdigit()) or int(ports[-1]) > MAX_PORT:
        raise UsageError(f"server argv: port {ports[-1]!r} is not a port number "
                         f"(0-{MAX_PORT})")
    return int(ports[-1])


def serve_config(options: argparse.Namespace, server_argv: Sequence[str]) -> ServeConfig:
    """The server's configuration from simulator options and the real server's argv."""
    from ..args import engine_config_from_argv
    from ..engine import Engine
    from .app import ServeConfig

    if not server_argv:
        raise UsageError("no server argv: give the real server's command line, e.g. "
                         "-- vllm serve MODEL --port 8000")
    faults = FaultConfig(
        fail_after_requests=options.fail_after_requests, error_rate=options.error_rate,
        truncate_rate=options.truncate_rate, never_ready=options.never_ready,
        startup_delay_s=options.startup_delay, stall_after_tokens=options.stall_after_tokens)
    problems = faults.problems()
    if not 0.0 <= options.eval_accuracy <= 1.0:
        problems.append(f"--eval-accuracy {options.eval_accuracy}: expected a probability "
                        "within [0, 1]")
    if problems:
        raise UsageError("; ".join(problems))
    decode_argv: list[str] = []
    if options.decode_workers and "--" in server_argv:
        # A deployment's second argv (the decode workers') follows a second `--`; without
        # --decode-workers a `--` stays in the argv (a wrapped `sim serve ... -- ...`).
        cut = list(server_argv).index("--")
        server_argv, decode_argv = list(server_argv[:cut]), list(server_argv[cut + 1:])
    if options.decode_workers and not options.prefill_workers:
        raise UsageError("--decode-workers needs --prefill-workers")
    try:
        engine_config, ignored = engine_config_from_argv(
            list(server_argv), hardware=options.hardware, env=dict(os.environ))
        if options.seed is not None:
            engine_config = dataclasses.replace(engine_config, seed=options.seed)
        calibration_note = None
        if options.calibration is not None:
            from ..calibrate.file import load as load_calibration

            calibration = load_calibration(options.calibration)
            engine_config = calibration.apply(engine_config)
            calibration_note = calibration.note(engine_config)
        engine: EngineLike
        info: dict[str, object] = {"engine": _engine_facts(engine_config)}
        if calibration_note is not None:
            info["calibration"] = calibration_note
        if options.prefill_workers:
            from .deployment import serve_deployment

            engine, deployment_info = serve_deployment(
                engine_config, decode_argv or list(server_argv), options)
            info["deployment"] = deployment_info
        else:
            engine = Engine(engine_config)  # fails now, with the reason, not at the first request
        oracle = None
        if options.eval_oracle is not None:
            oracle = load_oracle(options.eval_oracle, options.eval_accuracy,
                                 engine_config.seed)
    except (ValueError, OracleError) as exc:
        raise UsageError(str(exc)) from exc
    # Real servers answer to the model name as the argv spells it (the catalog folds case).
    as_given = [w.rpartition("=")[2] for w in server_argv
                if w.rpartition("=")[2].lower() == engine_config.model.lower()]
    served = flag_values(server_argv, "--served-model-name") or as_given[-1:] or [
        engine_config.model]
    # A framework whose own names are not modelled borrows its entry's persona (trt: vLLM's).
    persona = options.persona or registry.get(engine_config.framework).persona
    return ServeConfig(
        persona=persona, hardware=options.hardware, time_scale=options.time_scale,
        seed=engine_config.seed, served_models=tuple(served),
        max_model_len=engine_config.max_model_len,
        make_engine=lambda: engine, snapshot=snapshot_from_engine,
        extra_metrics=_role_collector if options.prefill_workers else None,
        faults=faults, oracle=oracle, timeline_bytes=int(options.timeline_mib * MIB),
        info={**info, "ignored_flags": list(ignored)})


def _role_collector(engine: EngineLike, model: str) -> Collector:
    from .deployment import RoleCollector

    return RoleCollector(engine, model)


def _engine_facts(config: object) -> dict[str, object]:
    facts = dataclasses.asdict(config) if dataclasses.is_dataclass(config) and not isinstance(
        config, type) else {}
    return {key: value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)
            for key, value in facts.items()}


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio turns TCP_NODELAY on for accepted sockets only when the
    # listening socket names its protocol, and Nagle's algorithm would hold small SSE chunks.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(2048)
    return sock


@dataclasses.dataclass(frozen=True)
class EventStack:
    """The event loop and HTTP parser uvicorn runs on.

    uvloop and httptools are in the base install: at conc 256 the server streams thousands of SSE
    chunks a second from one Python process, and asyncio's loop with the pure-Python h11 parser
    falls behind the model's timeline there (benchmarks/bench_sim_server.py measures both). Where
    a platform has no wheel for them (uvloop has none on Windows) the server runs on asyncio/h11
    and says so in its banner.
    """

    loop: str
    http: str

    @classmethod
    def best_available(cls) -> EventStack:
        return cls(loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
                   http="httptools" if importlib.util.find_spec("httptools") else "h11")


def banner(config: ServeConfig, host: str, port: int, stack: EventStack) -> str:
    engine = dict(config.info or {}).get("engine", {})
    assert isinstance(engine, dict)
    deployment = dict(config.info or {}).get("deployment")
    # A deployment's GPUs are its pools' (the next line); one engine's are its TP group.
    gpus = "" if isinstance(deployment, dict) else f"{engine.get('tp', '?')}x "
    lines = [
        f"inferbench-sim: SIMULATED {config.persona} server -- no GPU, every number it "
        f"produces is simulated",
        f"inferbench-sim: model {', '.join(config.served_models)} on {gpus}"
        f"{config.hardware}, time scale {config.time_scale}, seed {config.seed}",
        f"inferbench-sim: event loop {stack.loop}, HTTP parser {stack.http}",
        # Ends in the port: launchers and log readers take the port from this line.
        f"inferbench-sim: listening on http://{host}:{port}",
    ]
    calibration = dict(config.info or {}).get("calibration")
    if calibration:
        lines.insert(2, f"inferbench-sim: {calibration}")
    if isinstance(deployment, dict):
        lines.insert(2, f"inferbench-sim: deployment {deployment['topology']} "
                        f"({deployment['gpus']} GPUs), router {deployment['router']}")
    ignored = dict(config.info or {}).get("ignored_flags")
    if ignored:
        lines.append(f"inferbench-sim: server flags with no effect on the simulation: {ignored}")
    if config.faults.active:
        lines.append(f"inferbench-sim: fault injection: {', '.join(config.faults.active)}")
    if config.oracle is not None:
        lines.append(f"inferbench-sim: eval oracle with {len(config.oracle)} questions, "
                     f"accuracy {config.oracle.accuracy}")
    return "\n".join(lines)


def _write_port_file(path: Path, port: int) -> None:
    tmp = path.with_name(path.name + ".tmp")  # readers never see a half-written port
    tmp.write_text(str(port))
    tmp.replace(path)


def serve(argv: Sequence[str]) -> int:
    import uvicorn

    from .app import SimulatorApp

    sim_words, server_argv = split_argv(argv)
    options = build_parser().parse_args(sim_words)
    try:
        config = serve_config(options, server_argv)
        port = options.port if options.port is not None else argv_port(server_argv)
        sock = bind(options.host, port)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    except StartError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return START_FAILED_EXIT
    port = int(sock.getsockname()[1])
    stack = EventStack.best_available()
    print(banner(config, options.host, port, stack), flush=True)
    if options.port_file is not None:
        try:
            _write_port_file(options.port_file, port)
        except OSError as exc:
            sock.close()
            print(f"{PROG}: error: cannot write --port-file {options.port_file}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return START_FAILED_EXIT
    sim = SimulatorApp(config)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            sim.begin_shutdown()
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(
        sim.app(), log_level=options.log_level, access_log=False, lifespan="on",
        timeout_graceful_shutdown=2, loop=stack.loop, http=stack.http))
    server.run(sockets=[sock])
    return 0
