"""Command-line and ini options of the plugin, read once into a frozen `Settings`.

Precedence: command line, then ini, then the default. `plugin` registers the options and
stores `Settings.from_config(config)` in the config stash; everything else reads `Settings`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ..loadgen.datasets import RANDOM, DatasetError, DatasetSpec, parse_dataset, text_prompts
from ..loadgen.workload import DEFAULT_RANGE_RATIO, DEFAULT_STALL_TIMEOUT_S
from ..recipe.layout import BESIDE_RECIPES, Layout, discover
from ..results import catalog, run_dir
from .backend_registry import BACKENDS as REGISTRY
from .eval_data import parse_eval_data
from .registration import BACKENDS as BACKENDS
from .registration import GIT_TIMEOUT_S as GIT_TIMEOUT_S
from .registration import VALUE_OPTIONS
from .registration import add_options as add_options
from .registration import given as given
from .replay import ReplayOptions, replay_options
from .rules import REQUEST_RATE
from .slurm import SlurmSettings as SlurmSettings


@dataclass(frozen=True)
class Settings:
    backend: str
    results_dir: Path
    recipe_globs: tuple[str, ...]
    prompts_per_conc: int
    request_rate: float
    seed: int
    time_scale: float
    base_url: str | None
    launch_dir: Path | None
    startup_timeout_s: float | None
    docker_host: str | None
    docker_hosts: tuple[str, ...]
    gpus: str | None
    process_prefix: tuple[str, ...]
    pass_env: tuple[str, ...]
    skip_pull: bool
    gates_file: Path | None
    baseline: Path | None
    save_baseline: Path | None
    max_failure_ratio: float
    eval_data: Path | None  # GSM8K
    eval_required: bool
    eval_runner: str
    eval_limit: int | None
    pr_number: int | None
    changelog_base: str | None  # None: no changelog gate unless --inferbench-pr is given
    plots: bool
    eval_data_gpqa: Path | None = None
    range_ratio: float = DEFAULT_RANGE_RATIO
    warmup: str = "same"
    slurm: SlurmSettings = field(default_factory=lambda: SlurmSettings())
    runner_name: str | None = None
    layout: Layout = BESIDE_RECIPES
    changed_since: str | None = None
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    point_timeout_s: float | None = None
    baseline_any_setup: bool = False
    goodput: tuple[tuple[str, float], ...] = ()  # (ttft|tpot|e2el, limit in ms)
    progress: str = "auto"
    save_requests: bool = False
    dataset: DatasetSpec = RANDOM
    request_rates: tuple[float, ...] = ()  # a sweep: each point once per rate
    git_timeout_s: float = GIT_TIMEOUT_S
    keep_runs: int = run_dir.KEEP_RUNS
    docker_sim: bool = False  # docker backend: the simulator runs in every container
    traces: Path | None = None  # agentic replay: None = seeded synthetic traces
    # agentic points: duration, start, warmup
    replay: ReplayOptions = field(default_factory=ReplayOptions)
    sim_calibration: Path | None = None  # the simulator's calibration file (None: the profiles)

    @property
    def simulated(self) -> bool:
        """Whether every server of the run is the simulator: its results are predictions."""
        return REGISTRY[self.backend].simulated or self.docker_sim

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        def opt(name: str) -> str | None:
            value = config.getoption(name)
            return None if value is None or value is False else str(value)

        backend = opt("inferbench_backend") or str(config.getini("inferbench_backend")) or "sim"
        if backend not in BACKENDS:
            raise pytest.UsageError(
                f"inferbench_backend = {backend!r}: expected one of {', '.join(BACKENDS)}")
        eval_data = parse_eval_data(
            opt("inferbench_eval_data") or str(config.getini("inferbench_eval_data")))
        pass_env = opt("inferbench_pass_env") or "HF_TOKEN,HUGGING_FACE_HUB_TOKEN"
        results = opt("inferbench_results") or str(config.getini("inferbench_results"))
        ratio = config.getoption("inferbench_random_range_ratio")
        ratio = DEFAULT_RANGE_RATIO if ratio is None else float(ratio)  # preflight checks it
        rate = config.getoption("inferbench_request_rate")
        if rate is not None and opt("inferbench_request_rates"):
            # A sweep sets every point's rate: the single rate would be silently ignored.
            raise pytest.UsageError(
                f"--inferbench-request-rate {rate:g} and "
                f"--inferbench-request-rates {opt('inferbench_request_rates')}: give one of "
                "them (the sweep runs every point once per rate)")
        return cls(
            backend=backend,
            results_dir=Path(results),
            recipe_globs=tuple(config.getini("inferbench_recipes")),
            prompts_per_conc=int(opt("inferbench_prompts_per_conc") or 10),
            request_rate=float(opt("inferbench_request_rate") or math.inf),
            seed=int(opt("inferbench_seed") or 0),
            # 0 is a valid scale (as fast as possible), so test for None, not falsiness.
            time_scale=1.0 if (scale := opt("inferbench_time_scale")) is None else float(scale),
            base_url=opt("inferbench_base_url"),
            launch_dir=_path(opt("inferbench_launch_dir")),
            startup_timeout_s=_float(opt("inferbench_startup_timeout")),
            docker_host=opt("inferbench_docker_host"),
            docker_hosts=_words(opt("inferbench_docker_hosts"), ","),
            gpus=opt("inferbench_gpus"),
            process_prefix=_words(opt("inferbench_process_prefix"), None),
            pass_env=_words(pass_env, ","),
            skip_pull=bool(config.getoption("inferbench_skip_pull")),
            gates_file=_path(opt("inferbench_gates")),
            baseline=_path(opt("inferbench_baseline")),
            save_baseline=_path(opt("inferbench_save_baseline")),
            max_failure_ratio=float(opt("inferbench_max_failure_ratio") or 0.0),
            eval_data=eval_data.get("gsm8k"),
            eval_data_gpqa=eval_data.get("gpqa"),
            eval_required=bool(config.getini("inferbench_eval_required")),
            eval_runner=opt("inferbench_eval_runner") or "builtin",
            eval_limit=_int(opt("inferbench_eval_limit")),
            pr_number=_int(opt("inferbench_pr")),
            changelog_base=opt("inferbench_changelog_base"),
            plots=not config.getoption("inferbench_no_plots"),
            range_ratio=ratio,
            warmup=opt("inferbench_warmup") or "same",
            slurm=SlurmSettings.from_config(config),
            runner_name=opt("inferbench_runner_name"),
            changed_since=opt("inferbench_changed_since"),
            stall_timeout_s=DEFAULT_STALL_TIMEOUT_S
            if (stall := _float(opt("inferbench_stall_timeout"))) is None else stall,
            point_timeout_s=_float(opt("inferbench_point_timeout")),
            baseline_any_setup=bool(config.getoption("inferbench_baseline_any_setup")),
            goodput=parse_goodput(opt("inferbench_goodput")),
            progress=opt("inferbench_progress") or "auto",
            save_requests=bool(config.getoption("inferbench_save_requests")),
            dataset=_dataset(opt("inferbench_dataset"), opt("inferbench_request_rate")),
            request_rates=parse_rates(opt("inferbench_request_rates")),
            git_timeout_s=_ini_seconds("inferbench_git_timeout",
                                       str(config.getini("inferbench_git_timeout")),
                                       GIT_TIMEOUT_S),
            keep_runs=_keep_runs(str(config.getini("inferbench_keep_runs"))),
            docker_sim=_docker_sim(config, backend),
            traces=_path(opt("inferbench_traces")),
            replay=replay_options(config),
            sim_calibration=_sim_calibration(config, opt("inferbench_sim_calibration")),
            layout=discover(
                config.rootpath, tuple(config.getini("inferbench_recipes")),
                recipe_dirs=list(config.getini("inferbench_recipe_dirs")),
                changelog=str(config.getini("inferbench_changelog")),
                thresholds=str(config.getini("inferbench_eval_thresholds")),
                launch_dir=str(config.getini("inferbench_launch_dir")),
                include_deprecated=bool(config.getoption("inferbench_include_deprecated")
                                        or config.getini("inferbench_include_deprecated"))),
        )


def _docker_sim(config: pytest.Config, backend: str) -> bool:
    """`--inferbench-docker-sim` (or its ini key) is the docker backend's; with another backend
    it would be silently ignored, and the results taken for what that backend measures."""
    source = ("--inferbench-docker-sim" if config.getoption("inferbench_docker_sim")
              else "ini inferbench_docker_sim = true" if config.getini("inferbench_docker_sim")
              else None)
    if source is not None and backend != "docker":
        raise pytest.UsageError(f"{source} runs the simulator inside docker containers: it "
                                f"needs --inferbench-backend docker (this run's backend: "
                                f"{backend})")
    return source is not None




def split_path_problems(config: pytest.Config) -> list[str]:
    """`--inferbench-eval-data PATH` (two words) is a problem when PATH lies outside the current
    directory: pytest chooses the rootdir and the config file before the plugin's options are
    known, so it takes an existing PATH for a test path, and the rootdir (and .pytest_cache)
    silently moves towards PATH's folder. A PATH inside the current directory leaves them."""
    if hasattr(config, "workerinput"):
        return []  # the controller has checked the same command line
    here = Path(config.invocation_params.dir).resolve()
    words = [str(w) for w in config.invocation_params.args]
    return [f"{option} {value}: pytest takes {value} for a test path when it chooses the "
            f"rootdir (now {config.rootpath}) and the config file; write {option}={value}"
            for option, value in itertools.pairwise(words)
            if option in VALUE_OPTIONS and (here / value).resolve().exists()
            and not (here / value).resolve().is_relative_to(here)]


def _dataset(text: str | None, rate: str | None) -> DatasetSpec:
    try:
        spec = parse_dataset(text) if text else RANDOM
        if spec.kind == "multiturn" and rate is not None and not math.isinf(float(rate)):
            raise DatasetError(f"--inferbench-dataset {text}: a turn waits for the previous one, "
                               "so multi-turn runs closed loop only (no --inferbench-request-rate)")
        if spec.path is not None:
            text_prompts(spec)  # a bad file is a usage error now, not a traceback per point
        return spec
    except DatasetError as exc:
        raise pytest.UsageError(str(exc)) from None


def parse_rates(text: str | None) -> tuple[float, ...]:
    """`1,2,4,inf` -> (1.0, 2.0, 4.0, inf): requests per second, each > 0, in the order given."""
    rates: list[float] = []
    for word in _words(text, ","):
        try:
            rate = float(word)
        except ValueError:
            rate = math.nan
        if not REQUEST_RATE.accepts(rate):
            raise pytest.UsageError(
                f"--inferbench-request-rates {text!r}: {word!r} is not a rate > 0 (expected "
                f"{REQUEST_RATE.expected}), e.g. '1,2,4,inf'")
        if rate not in rates:
            rates.append(rate)
    return tuple(rates)


def parse_goodput(text: str | None) -> tuple[tuple[str, float], ...]:
    """`ttft:2000 tpot:50` -> (("ttft", 2000.0), ("tpot", 50.0)), as vLLM's --goodput reads."""
    slos: dict[str, float] = {}
    for word in (text or "").split():
        name, _, value = word.partition(":")
        try:
            limit = float(value)
        except ValueError:
            limit = math.nan
        allowed = catalog.goodput_metrics()
        if name not in allowed or not limit >= 0:
            raise pytest.UsageError(
                f"--inferbench-goodput {text!r}: {word!r} is not METRIC:MS with METRIC one of "
                f"{', '.join(allowed)} and MS a number >= 0 (e.g. 'ttft:2000 tpot:50')")
        slos[name] = limit
    return tuple(slos.items())


def _sim_calibration(config: pytest.Config, option: str | None) -> Path | None:
    """The option's path as given (relative to the working directory), else the ini key's,
    relative to the rootdir; None when neither names one."""
    if option:
        return Path(option)
    ini = str(config.getini("inferbench_sim_calibration"))
    return config.rootpath / ini if ini else None


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _float(value: str | None) -> float | None:
    return float(value) if value is not None else None


def _ini_seconds(name: str, text: str, default: float) -> float:
    """An ini number of seconds (the default when empty); preflight checks its range."""
    try:
        return float(text) if text.strip() else default
    except ValueError:
        raise pytest.UsageError(f"{name} = {text!r}: not a number of seconds") from None


def _keep_runs(text: str) -> int:
    if not text.strip():
        return run_dir.KEEP_RUNS
    try:
        keep = int(text)
    except ValueError:
        keep = -1
    if keep < 0:
        raise pytest.UsageError(f"inferbench_keep_runs = {text!r}: expected a whole number >= 0 "
                                "(how many earlier runs' results directories to keep)")
    return keep


def _int(value: str | None) -> int | None:
    return int(value) if value is not None else None


def _words(value: str | None, sep: str | None) -> tuple[str, ...]:
    return tuple(w.strip() for w in (value or "").split(sep) if w.strip())
