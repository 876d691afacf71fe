"""Every option, ini value and config file checked once, before any server starts.

A typo must not cost a sweep: a gates file, a baseline or a launch spec read only after a
30-minute server start would fail every point after its load. So the session checks, at
configure, every inferbench option and ini value (types, ranges, finiteness, paths), and once
collection is done (before the first item runs), the files the collected points will read:
gates files, eval thresholds, the baseline and every server node's launch spec. Every problem
is reported at once, each with its option name or `file:line`, as one usage error.

The readers themselves stay the one truth of what a file may hold: this module calls them
(`gates.load_gates`, `launch.resolve`, ...) and adds only what they cannot know alone, such as
whether a gate's metric is a key the results will have.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from ..options.rules import PROMPTS_PER_CONC, REQUEST_RATE, SEED, Rule

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..options import Settings
    from ..recipe.model import ServerConfig


class PreflightError(Exception):
    """Problems found before the run; `problems` holds one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def checked_settings(config: pytest.Config) -> Settings:
    """The session's settings; every problem of its options at once as a usage error."""
    from ..options import Settings, split_path_problems

    problems = split_path_problems(config)
    try:
        settings = Settings.from_config(config)
    except pytest.UsageError as exc:  # a value that cannot even be read: said with the others
        raise pytest.UsageError(_usage("inferbench options", [*problems, str(exc)])) from None
    problems += check_settings(settings)
    if problems:
        raise pytest.UsageError(_usage("inferbench options", problems))
    return settings


def check_collected(servers: Iterable[ServerConfig], settings: Settings) -> None:
    """At the end of collection: every problem of the files the points will read, at once."""
    problems = check_files(servers, settings)
    if problems:
        raise pytest.UsageError(_usage("inferbench config files", problems))


def servers_of_node_ids(root: Path, node_ids: Iterable[str], recipe_globs: tuple[str, ...]
                        ) -> list[ServerConfig]:
    """The servers a worker collected, read again from their recipe files (an xdist controller
    collects nothing itself; a worker must not raise a usage error, xdist takes it for a
    crash)."""
    from fnmatch import fnmatch

    from ..recipe.schema import RecipeError, load_recipe

    wanted: dict[str, set[str]] = {}
    for node_id in node_ids:
        parts = node_id.split("::")
        if len(parts) >= 2 and any(fnmatch(Path(parts[0]).name, g) for g in recipe_globs):
            wanted.setdefault(parts[0], set()).add(parts[1])
    servers: list[ServerConfig] = []
    for file, names in wanted.items():
        try:
            recipe = load_recipe(root / file, strict=False)
        except (RecipeError, OSError):
            continue  # the worker reported it as a collection error
        servers += [s for s in recipe.servers if s.node_name in names]
    return servers


def _usage(what: str, problems: list[str]) -> str:
    noun = "problem" if len(problems) == 1 else "problems"
    return f"{len(problems)} {noun} in the {what}, nothing was run:\n  " + "\n  ".join(problems)


def _number(problems: list[str], option: str, value: float | None, rule: Rule) -> None:
    if value is not None and not rule.accepts(value):
        shown = f"{value:g}" if math.isfinite(value) else str(value)
        problems.append(f"{option} {shown}: expected {rule.expected}")


SECONDS = Rule("a finite number of seconds > 0", low=0.0, low_open=True)


def check_settings(settings: Settings) -> list[str]:
    """Problems of the options and ini values, one line each, naming the option."""
    p: list[str] = []
    _number(p, "--inferbench-max-failure-ratio", settings.max_failure_ratio,
            Rule("a fraction within [0, 1] (0 = no failed request allowed)", low=0.0, high=1.0))
    _number(p, "--inferbench-request-rate", settings.request_rate, REQUEST_RATE)
    _number(p, "--inferbench-prompts-per-conc", settings.prompts_per_conc, PROMPTS_PER_CONC)
    _number(p, "--inferbench-time-scale", settings.time_scale,
            Rule("a finite number >= 0 (1 = real time, 0 = as fast as possible)", low=0.0,
                 high=1000.0))
    _number(p, "--inferbench-startup-timeout", settings.startup_timeout_s, SECONDS)
    _number(p, "--inferbench-stall-timeout", settings.stall_timeout_s, SECONDS)
    _number(p, "--inferbench-point-timeout", settings.point_timeout_s, SECONDS)
    _number(p, "--inferbench-random-range-ratio", settings.range_ratio,
            Rule("a number within [0, 1]", low=0.0, high=1.0))
    _number(p, "--inferbench-eval-limit", settings.eval_limit,
            Rule("a number of questions >= 1", low=1))
    _number(p, "--inferbench-pr", settings.pr_number, Rule("a PR number >= 1", low=1))
    _number(p, "--inferbench-seed", settings.seed, SEED)
    _number(p, "inferbench_git_timeout", settings.git_timeout_s, SECONDS)
    p += _url_problems(settings)
    p += _path_problems(settings)
    if settings.backend == "external" and not settings.base_url:
        p.append("--inferbench-backend external: needs --inferbench-base-url URL (the server "
                 "to benchmark)")
    for name in settings.pass_env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            p.append(f"--inferbench-pass-env: {name!r} is not an environment variable name")
    if settings.gpus is not None:
        from ..backends.gpu import GpuSpecError, parse_gpu_ids

        try:
            parse_gpu_ids(settings.gpus)
        except GpuSpecError as exc:
            p.append(f"--inferbench-gpus: {exc}")
    return p


def _url_problems(settings: Settings) -> list[str]:
    if settings.base_url is None:
        return []
    try:
        parts = urlsplit(settings.base_url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError as exc:
        return [f"--inferbench-base-url: not a URL ({exc})"]
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return ["--inferbench-base-url: expected http://HOST[:PORT] or https://..., got "
                f"{_url_shown(settings.base_url)!r}"]
    return []


def _url_shown(url: str) -> str:
    """The URL with any user:password part masked."""
    return re.sub(r"//[^/@]*@", "//***@", url)


def _path_problems(settings: Settings) -> list[str]:
    p: list[str] = []
    results = settings.results_dir
    if results.exists() and not results.is_dir():
        p.append(f"--inferbench-results {results}: exists and is not a directory")
    elif not _creatable(results):
        p.append(f"--inferbench-results {results}: cannot be created or written")
    if (save := settings.save_baseline) is not None:
        if save.is_dir():
            p.append(f"--inferbench-save-baseline {save}: is a directory (expected a file "
                     "path, e.g. baseline.json)")
        elif not _creatable(save.parent):
            p.append(f"--inferbench-save-baseline {save}: its directory cannot be written")
    for option, path, kind in (("--inferbench-gates", settings.gates_file, "file"),
                               ("--inferbench-eval-data", settings.eval_data, "file"),
                               ("--inferbench-eval-data gpqa", settings.eval_data_gpqa, "file"),
                               ("--inferbench-launch-dir", settings.launch_dir, "dir"),
                               ("--inferbench-baseline", settings.baseline, "any")):
        if path is None:
            continue
        if not path.exists():
            p.append(f"{option} {path}: does not exist")
        elif kind == "file" and not path.is_file():
            p.append(f"{option} {path}: is not a file")
        elif kind == "dir" and not path.is_dir():
            p.append(f"{option} {path}: is not a directory")
        elif not os.access(path, os.R_OK):
            p.append(f"{option} {path}: cannot be read")
    baseline = settings.baseline
    if (baseline is not None and results.is_dir() and any(results.iterdir())
            and (baseline.resolve() == results.resolve()
                 or results.resolve() in baseline.resolve().parents)):
        p.append(f"--inferbench-baseline {baseline}: lies in the results directory {results}, "
                 "which holds an earlier run and is moved aside when this run starts; copy the "
                 "baseline elsewhere or give this run another --inferbench-results")
    thresholds = settings.layout.thresholds
    if thresholds is not None and thresholds.exists() and not thresholds.is_file():
        p.append(f"inferbench_eval_thresholds {thresholds}: is not a file")
    return p


def _creatable(directory: Path) -> bool:
    """The directory exists and is writable, or its nearest existing parent is."""
    for candidate in (directory, *directory.absolute().parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
    return False


def check_files(servers: Iterable[ServerConfig], settings: Settings) -> list[str]:
    """Problems of the files the collected servers' points will read: gates files (every
    metric a key the results have), eval thresholds, the baseline, the launch specs."""
    from ..gates import GatesFileError, load_baseline_for, load_gates
    from ..gates.baseline import BaselineError
    from ..recipe.golden import GoldenALError
    from ..recipe.launch import LaunchSpecError, launch_spec_path, resolve

    problems: list[str] = []
    seen: set[object] = set()

    def once(key: object) -> bool:
        new = key not in seen
        seen.add(key)
        return new

    servers = list(servers)
    for server in servers:
        directory = Path(server.source).resolve().parent
        if once(("gates", directory)):
            try:
                load_gates(server.source, settings)
            except (GatesFileError, GoldenALError) as exc:
                problems += str(exc).splitlines()
        thresholds = settings.layout.thresholds_for(Path(server.source))
        if once(("thresholds", thresholds)):
            problems += _thresholds_problems(thresholds)
        launch_dir = settings.launch_dir or settings.layout.launch_dir_for(server.source)
        path = launch_spec_path(server, launch_dir)
        if path.is_file() and once(("launch", path, server)):
            # A missing spec errors its own node at setup (named there); a broken one is a typo
            # to fix before any server starts.
            try:
                spec = resolve(server, launch_dir,
                               startup_timeout_override=settings.startup_timeout_s)
            except LaunchSpecError as exc:
                if once(("launch-error", str(exc))):
                    problems.append(str(exc))
            else:
                problems += [m for m in _mount_problems(spec.mounts, str(path), settings)
                             if once(("mount", m))]
    problems += _simulator_problems(servers, settings)
    problems += _calibration_problems(settings)
    if servers and settings.eval_data is not None and settings.eval_data.is_file():
        from ..evals.gsm8k import EvalDataError, load_items

        try:
            load_items(settings.eval_data)
        except EvalDataError as exc:
            problems.append(f"--inferbench-eval-data: {exc}")
    if servers and settings.eval_data_gpqa is not None and settings.eval_data_gpqa.is_file():
        from ..evals.gpqa import load_rows
        from ..evals.gsm8k import EvalDataError

        try:
            load_rows(settings.eval_data_gpqa)
        except EvalDataError as exc:
            problems.append(f"--inferbench-eval-data gpqa: {exc}")
    if servers and settings.baseline is not None and settings.baseline.exists():
        try:
            load_baseline_for(settings)
        except BaselineError as exc:
            problems.append(str(exc))
    return problems


def _simulator_problems(servers: Iterable[ServerConfig], settings: Settings) -> list[str]:
    """Runners whose hardware the simulator has no figures for: each would collect and then
    error at setup, so a simulating backend refuses them before the first start."""
    from ..backends import simulator_lacks_hardware

    if not settings.simulated:
        return []
    problems: dict[str, None] = {}  # one line per entry, however many servers it has
    for server in servers:
        if server.skip_reason is not None:
            continue  # never started
        lack = simulator_lacks_hardware(server.hardware)
        if lack is not None:
            problems[f"{server.source}:{server.line}: {server.config_key}.runner "
                     f"{server.runner!r}: the {settings.backend} backend cannot simulate it: "
                     f"{lack}"] = None
    return list(problems)


def _calibration_problems(settings: Settings) -> list[str]:
    """A calibration file that cannot be used, or given to a backend that does not simulate."""
    if settings.sim_calibration is None:
        return []
    if settings.backend not in ("sim", "sim-server") or settings.docker_sim:
        return [f"--inferbench-sim-calibration {settings.sim_calibration}: only the sim and "
                f"sim-server backends use a calibration, this run's backend is "
                f"{settings.backend}{' (docker-sim)' if settings.docker_sim else ''}"]
    from ..backends import sim_calibration_problem

    problem = sim_calibration_problem(settings)
    return [] if problem is None else [problem]


def _mount_problems(mounts: Iterable[str], where: str, settings: Settings) -> list[str]:
    """Host paths of docker bind mounts that do not exist: the engine would create them, owned
    by root. Only a local engine's host is this machine; the simulator (--inferbench-docker-sim)
    mounts none of a launch spec's."""
    remote = os.environ.get("DOCKER_HOST", "").startswith(("tcp:", "ssh:"))
    if (settings.backend != "docker" or settings.docker_sim or settings.docker_host
            or settings.docker_hosts or remote):
        return []
    return [f"{where}: mounts: host path {mount.split(':')[0]} does not exist (the Docker "
            "Engine would create it, owned by root)"
            for mount in mounts if not Path(mount.split(":")[0]).exists()]


def _thresholds_problems(path: Path) -> list[str]:
    from ..evals.thresholds import ThresholdsError, validate_thresholds

    if not path.exists():
        return []
    if not path.is_file():
        return [f"{path}: eval thresholds: is not a file"]
    try:
        validate_thresholds(path)
    except ThresholdsError as exc:
        return [str(exc)]
    return []
