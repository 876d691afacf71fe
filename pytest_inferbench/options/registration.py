"""The plugin's command-line options and ini keys, declared once: names, kinds, help texts and
defaults (`add_options`), and whether a run sets any of them (`given`). `Settings` reads them.
"""

from __future__ import annotations

import pytest

from ..loadgen.workload import DEFAULT_STALL_TIMEOUT_S, WARMUP_MODES
from ..results import catalog, run_dir
from .backend_registry import BACKENDS as REGISTRY
from .slurm import IniType, add_slurm_options

BACKENDS = tuple(REGISTRY)
PROGRESS_MODES = ("auto", "lines", "off")  # report/live.py gives each its meaning
EVAL_RUNNERS = ("builtin", "lm-eval")
# Seconds one git command (changelog gate, --inferbench-changed-since) may take before it counts
# as hung; the `inferbench_git_timeout` ini value overrides it.
GIT_TIMEOUT_S = 60.0


# What an option's value is: a string, int or float (with its metavar), one of the choices
# in a tuple, or `bool` for a switch (store_true).
OptionKind = type[str] | type[int] | type[float] | type[bool] | tuple[str, ...]
# (name after --inferbench-, kind, metavar, help), in --help order. A help text is a paragraph:
# its line breaks and indents are spaces.
OPTIONS: tuple[tuple[str, OptionKind, str | None, str], ...] = (
    ("backend", BACKENDS, None, """how each server node is served: sim (virtual-time simulator,
        default), sim-server (simulator over HTTP as a subprocess), docker, process, external,
        slurm"""),
    ("results", str, "DIR", """directory for result JSON, logs, plots (default:
        inferbench-results)"""),
    ("prompts-per-conc", int, "N", """requests per point = N x concurrency (default 10, as
        InferenceX)"""),
    ("request-rate", float, "RPS", """open-loop Poisson arrival rate; default inf = closed loop at
        the concurrency"""),
    ("request-rates", str, "RPS,...", """a request-rate sweep: every point runs once per rate, e.g.
        '1,2,4,inf' (its items and files end in -rate<R>)"""),
    ("seed", int, None, "workload seed (default 0)"),
    ("dataset", str, "SPEC", """what prompts are drawn from: random (default), sharegpt:PATH
        (ShareGPT JSON), jsonl:PATH ({"prompt": ...} a line), prefix:GROUPS:TOKENS (random
        prompts in GROUPS groups sharing their first TOKENS tokens)"""),
    ("goodput", str, "SLOS", f"""fill request_goodput as vLLM's --goodput does: requests/s that
        meet every SLO, e.g. 'ttft:2000 tpot:50' (ms; {', '.join(catalog.goodput_metrics())})"""),
    ("random-range-ratio", float, "R", """request lengths uniform in [R x ISL, ISL] and [R x OSL,
        OSL] (default 0.8, as InferenceX; 1.0 = fixed lengths)"""),
    ("warmup", WARMUP_MODES, None, """warmup requests: 'same' repeats the first prompt (default, as
        InferenceX, so results compare with its numbers); 'distinct' sends prompts of their
        own"""),
    ("time-scale", float, "S", """sim-server clock: 1.0 = real time, 0 = as fast as possible
        (default 1.0)"""),
    ("sim-calibration", str, "FILE", """sim and sim-server backends: price steps with the knobs of
        this calibration file (`python -m pytest_inferbench.sim calibrate`) where it has an
        entry for a server's hardware, framework and model (ini inferbench_sim_calibration)"""),
    ("base-url", str, "URL", "external backend: benchmark this already running server"),
    ("launch-dir", str, "DIR", """directory of launch specs (default: launch/ next to each recipe
        file)"""),
    ("startup-timeout", float, "S", "override every launch spec's startup timeout"),
    ("stall-timeout", float, "S", f"""a request that receives no data for S seconds fails (default
        {DEFAULT_STALL_TIMEOUT_S:g}; covers the wait for the first token too)"""),
    ("point-timeout", float, "S", """deadline of a point's load (and of its warmup): requests still
        open after S seconds fail, those not sent are not sent; the point keeps what was
        measured (default: none)"""),
    ("traces", str, "PATH", """agentic-coding points replay the traces of this traces.jsonl file
        (or of the one in this directory); default: seeded synthetic traces"""),
    ("replay-duration", float, "S", """agentic-coding points: seconds of replay before no new
        request is sent (default 3600, as InferenceX; ini inferbench_replay_duration)"""),
    ("trajectory-start-min-ratio", float, "R", """agentic-coding points: each lane's first
        tree starts at a seeded instant at least R of the way through its recorded span (default
        0.25, as InferenceX; ini inferbench_trajectory_start_min_ratio)"""),
    ("trajectory-start-max-ratio", float, "R", """... and at most R of the way (default 0.75,
        as InferenceX; ini inferbench_trajectory_start_max_ratio)"""),
    ("warmup-requests-per-lane", int, "N", """agentic-coding points: after its primers, each
        lane sends its next N requests as one-token warmups, measured by nothing (default 10,
        as InferenceX; ini inferbench_warmup_requests_per_lane)"""),
    ("agentic-fast", bool, None, """agentic-coding points: InferenceX's fast mode
        (AIPERF_EXPERIMENTAL_FAST): 1200 s of replay after 1 warmup request per lane (ini
        inferbench_agentic_fast)"""),
    ("docker-host", str, "URL", "Docker Engine to use (default: DOCKER_HOST or the local socket)"),
    ("docker-hosts", str, "H1,H2", "one Docker Engine per xdist worker, assigned in order"),
    ("gpus", str, "IDS", "GPU ids to split between xdist workers, e.g. 0-7"),
    ("process-prefix", str, "ARGV", """process backend: words put before the server argv (e.g.
        'srun --gres=gpu:4')"""),
    ("pass-env", str, "NAMES", """comma-separated host variables passed to servers (default
        HF_TOKEN,HUGGING_FACE_HUB_TOKEN)"""),
    ("skip-pull", bool, None, "docker backend: never pull; the image must be present"),
    ("docker-sim", bool, None, """docker backend: run the simulated server with the launch spec's
        argv in each container, from a locally built image (inferbench-sim:local, no pull, no
        GPU): the docker flow tried without the real image; its results are simulated"""),
    ("gates", str, "PATH", """SLO gates file (default: gates.yaml next to each recipe file, when
        present)"""),
    ("baseline", str, "PATH", "results JSON (summary.json or a directory) to compare against"),
    ("baseline-any-setup", bool, None, """compare against a baseline measured with another backend,
        time scale or client settings (refused by default)"""),
    ("save-baseline", str, "PATH", "write this run's results as a baseline file"),
    ("max-failure-ratio", float, "R", "allowed ratio of failed requests per point (default 0)"),
    ("eval-data", str, "PATH", """GSM8K jsonl (test split) for the eval items; train.jsonl beside
        it gives the shots; per task: gsm8k=PATH,gpqa=PATH (GPQA diamond csv or jsonl)"""),
    ("eval-runner", EVAL_RUNNERS, None, "builtin (default) or lm-eval"),
    ("eval-limit", int, "N", "evaluate only the first N questions"),
    ("pr", int, "N", """changelog items: entries added since --inferbench-changelog-base must link
        PR N"""),
    ("changelog-base", str, "REV", """git revision the changelog is compared against: history
        immutable, additions at the end, added entries name configs the branch changed
        (default with --inferbench-pr: origin/main)"""),
    ("changed-since", str, "REV", """run only the server nodes whose recipe entry, launch spec or
        server script changed since git revision REV, or that changelog entries added since
        REV name"""),
    ("runner-name", str, "NAME", """runner name that ends each point's RESULT_FILENAME, as
        InferenceX's workflow names it (default: $RUNNER_NAME on a GitHub runner, else the
        recipe's runner)"""),
    ("save-requests", bool, None, """write every request of every point to
        <results>/requests/<RESULT_FILENAME>.jsonl (send time, TTFT, ITLs, token counts,
        status, error)"""),
    ("progress", PROGRESS_MODES, None, """auto (default): a live line on a terminal, else one line
        per point when it ends (and every 30 s while an HTTP point runs); lines: always those
        lines; off: none"""),
    ("no-plots", bool, None, "do not draw PNG plots even when matplotlib is installed"),
    ("include-deprecated", bool, None, """also collect the retired master configs in a recipe
        directory's deprecated/ (InferenceX: configs/deprecated/), left out by default"""),
)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("inferbench", "LLM inference benchmarks (pytest-inferbench)")
    for name, kind, metavar, paragraph in OPTIONS:
        flag, text = f"--inferbench-{name}", " ".join(paragraph.split())
        if kind is bool:
            group.addoption(flag, action="store_true", default=False, help=text)
        elif isinstance(kind, tuple):
            group.addoption(flag, choices=kind, default=None, help=text)
        else:
            group.addoption(flag, type=kind, default=None, metavar=metavar, help=text)

    add_slurm_options(parser, _addini)
    VALUE_OPTIONS.update(name for opt in group.options if opt.attrs().get("action") != "store_true"
                         for name in opt.names())

    _addini(parser, "inferbench_recipes", "glob patterns of recipe files", type="linelist",
                  default=["*-master.yaml"])
    _addini(parser, "inferbench_backend", "default backend", default="sim")
    _addini(parser, "inferbench_sim_calibration", "calibration file of the simulated backends, "
                  "relative to the rootdir (as --inferbench-sim-calibration)", default="")
    _addini(parser, "inferbench_replay_duration", "agentic-coding replay seconds (default 3600)")
    _addini(parser, "inferbench_trajectory_start_min_ratio", "agentic-coding replay: where each "
                  "lane's first tree starts at the earliest, of its recorded span (default 0.25)")
    _addini(parser, "inferbench_trajectory_start_max_ratio", "agentic-coding replay: where each "
                  "lane's first tree starts at the latest, of its recorded span (default 0.75)")
    _addini(parser, "inferbench_warmup_requests_per_lane", "agentic-coding replay: warmup "
                  "requests per lane after its primers (default 10)")
    _addini(parser, "inferbench_agentic_fast", "agentic-coding replay: InferenceX's fast mode, "
                  "1200 s after 1 warmup request per lane (as --inferbench-agentic-fast)",
                  type="bool", default=False)
    _addini(parser, "inferbench_results", "results directory", default="inferbench-results")
    _addini(parser, "inferbench_eval_data", "GSM8K jsonl for eval items (per task: "
                  "gsm8k=PATH,gpqa=PATH)", default="")
    _addini(parser, "inferbench_eval_required", "fail eval items that have no data", type="bool",
                  default=False)
    # Where things are (relative to the rootdir); an InferenceX checkout needs none of these.
    _addini(parser, "inferbench_recipe_dirs", "directories of recipe files, collected even when "
                  "their names start with a dot (InferenceX: .github/configs)", type="linelist",
                  default=[])
    _addini(parser, "inferbench_changelog", "the perf-changelog.yaml to check (InferenceX: the "
                  "repository root's; default: one beside the recipes)", default="")
    _addini(parser, "inferbench_eval_thresholds", "eval thresholds YAML or JSON (InferenceX: "
                  "utils/evals/thresholds.yaml; default: evals/thresholds.yaml or .json beside "
                  "the recipes)", default="")
    _addini(parser, "inferbench_launch_dir", "directory of launch specs (default: launch/ beside "
                  "each recipe file); --inferbench-launch-dir overrides it", default="")
    _addini(parser, "inferbench_include_deprecated", "also collect the retired master configs "
                  "in configs/deprecated/ (default: left out)", type="bool", default=False)
    _addini(parser, "inferbench_docker_sim", "docker backend: run the simulated server in "
                  "place of each image's server (as --inferbench-docker-sim)", type="bool",
                  default=False)
    _addini(parser, "inferbench_keep_runs", "earlier runs' results directories kept beside the "
                  f"results directory; older ones are removed (default {run_dir.KEEP_RUNS})",
                  default="")
    _addini(parser, "inferbench_git_timeout", "seconds one git command of the changelog gate "
                  f"or --inferbench-changed-since may take (default {GIT_TIMEOUT_S:g})",
                  default="")



# Every inferbench option that takes a value, filled as the options are declared.
VALUE_OPTIONS: set[str] = set()


# Every inferbench ini key and its default, filled as the keys are declared.
INI_DEFAULTS: dict[str, object] = {}


def _addini(parser: pytest.Parser, name: str, text: str, type: IniType = "string",
            default: object = "") -> None:
    INI_DEFAULTS[name] = default
    parser.addini(name, text, type=type, default=default)


def given(config: pytest.Config) -> bool:
    """Whether the command line or the ini file sets any inferbench option."""
    for name, value in vars(config.option).items():
        if name.startswith("inferbench_") and value not in (None, False):
            return True
    # An ini value that differs from its default was set (pytest offers no other public way
    # to ask whether the file names a key).
    return any(config.getini(name) != default for name, default in INI_DEFAULTS.items())
