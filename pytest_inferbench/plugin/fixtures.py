"""Fixtures for benchmarks written in Python, on the machinery the recipe items use.

- `inferbench_server`: the server of the test's `@pytest.mark.inferbench_server(key, tp=4)`
  marker, from the server pool (`server_pool.py`): a recipe node and any test asking for the same
  server share one start.
- `inferbench_servers`: a factory, `inferbench_servers("key", tp=4) -> Server`, for tests that
  pick servers at run time or use several.
- `inferbench_load`: runs one point against a server (the marked one unless `server=` is
  given): ISL/OSL/concurrency or the test's own prompts, request rate, prompts per
  concurrency, seed, an agentic server's replay start. It is the recipe item's body
  (`runner.run_bench_item`): the same result record, the same gates, the same files, JUnit
  properties, table rows and summary.json entry.
- `inferbench_eval`: GSM8K against a server, as a recipe node's `eval-gsm8k` item runs it.
- `inferbench_results_dir`, `inferbench_run`: where results go, and what this run is.

The plugin registers them always; they do nothing until a test asks for one, and a test that
does engages the plugin (header, report collector) as a recipe file would.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from ..options.replay import ReplayStart
from ..options.rules import (
    CONCURRENCY,
    PROMPTS_PER_CONC,
    REQUEST_RATE,
    SEED,
    TOKENS,
    Rule,
)
from ..results.file_names import digest
from ..state import get_session_state
from . import activation
from .collect import CLEAN_ERRORS
from .runner import run_bench_item
from .server_marker import MARKER, ServerSelectError, find_server, item_server, names_server
from .server_pool import WANTS_KEY, group_with_server, pool_for, server_key

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from pathlib import Path

    from ..backends.base import ServerHandle
    from ..evals.runner import EvalResult
    from ..options import Settings
    from ..recipe.launch import ServerSpec
    from ..recipe.model import ServerConfig
    from ..results.record import JSONValue, PointRecord
    from .server_pool import Lease

FIXTURES = ("inferbench_server", "inferbench_servers", "inferbench_load", "inferbench_eval",
            "inferbench_results_dir", "inferbench_run")


@dataclass(frozen=True)
class Server:
    """A running server as a test sees it."""

    config: ServerConfig  # the recipe's server (identity, model, image, TP, ...)
    lease: Lease  # the pool's entry: spec, handle and whether it died

    @property
    def name(self) -> str:
        return self.config.node_name

    @property
    def spec(self) -> ServerSpec | None:
        return self.lease.spec

    @property
    def handle(self) -> ServerHandle:
        assert self.lease.handle is not None  # the pool raises when a start failed
        return self.lease.handle

    @property
    def base_url(self) -> str | None:
        """The OpenAI-compatible address; None on the in-process `sim` backend."""
        return self.handle.base_url


@dataclass(frozen=True)
class PointResult:
    """One point's result record (the recipe items' record: `result["p99_ttft"]`) and the
    reasons its gates failed (empty when it passed)."""

    record: PointRecord
    failures: tuple[str, ...]

    def __getitem__(self, key: str) -> JSONValue:
        return self.record[key]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def acceptance_length(self) -> float | None:
        value = self.record.get("acceptance_length")
        return float(value) if isinstance(value, (int, float)) else None


@dataclass(frozen=True)
class RunInfo:
    """The run: its id, backend, worker, results directory and settings."""

    run_id: str
    backend: str
    simulated: bool  # the backend predicts numbers instead of measuring hardware
    worker_id: str
    results_dir: Path
    settings: Settings


def _use(config: pytest.Config) -> None:
    activation.engage(config)


def _acquire(request: pytest.FixtureRequest, server: ServerConfig) -> Server:
    pool = pool_for(request.config)
    try:
        lease = pool.acquire(server)
    except CLEAN_ERRORS as exc:  # the message names the cause and carries the log tail
        pytest.fail(str(exc), pytrace=False)
    request.addfinalizer(lambda: pool.release(lease))
    if lease.dead_reason is not None:
        pytest.fail(f"{lease.name}: the server died during an earlier test or point:\n"
                    f"{lease.dead_reason}", pytrace=False)
    return Server(config=server, lease=lease)


@pytest.fixture
def inferbench_server(request: pytest.FixtureRequest) -> Server:
    """The server the test names: by `@pytest.mark.inferbench_server(...)`, or by indirect
    parametrization with config keys (or dicts of a config key and selectors)."""
    _use(request.config)
    try:
        server = item_server(request.config, request.node)
    except ServerSelectError as exc:
        pytest.fail(str(exc), pytrace=False)
    if server is None:
        pytest.fail(f"inferbench_server needs @pytest.mark.{MARKER}(config_key, ...) on the "
                    "test, or indirect parametrization with config keys; "
                    "inferbench_servers(config_key, ...) starts servers without either",
                    pytrace=False)
    return _acquire(request, server)


@pytest.fixture
def inferbench_servers(request: pytest.FixtureRequest) -> Callable[..., Server]:
    """`inferbench_servers(config_key, recipe=None, **selectors) -> Server`: a server by its
    config key, shared through the pool; the test holds it until it ends."""
    _use(request.config)

    def start(config_key: str, *, recipe: str | None = None, **selectors: object) -> Server:
        try:
            server = find_server(request.config, config_key, recipe=recipe, **selectors)
        except ServerSelectError as exc:
            pytest.fail(str(exc), pytrace=False)
        return _acquire(request, server)

    return start


def _tag(request: pytest.FixtureRequest, call: int) -> str:
    """A file-name-safe tag for a test's point: the test name, a digest of its nodeid (tests
    of one name in other classes or modules, and ids that read alike once made file-safe,
    get tags of their own), and the call's number after the first."""
    name = re.sub(r"[^A-Za-z0-9.-]+", "-", request.node.name).strip("-")
    tag = f"{name}-{digest(request.node.nodeid, TAG_DIGEST_CHARS)}"
    return tag if call == 0 else f"{tag}-{call + 1}"


TAG_DIGEST_CHARS = 8  # with the test name beside it; the writer's claim settles the rest


@pytest.fixture
def inferbench_load(request: pytest.FixtureRequest) -> Callable[..., PointResult]:
    """`inferbench_load(isl=, osl=, conc=, *, prompts=None, request_rate=None,
    prompts_per_conc=None, seed=None, server=None, check=True, trajectory_start_min_ratio=None,
    trajectory_start_max_ratio=None, warmup_requests_per_lane=None, agentic_fast=None)
    -> PointResult`.

    Runs one point as a recipe item does. With `prompts`, those texts are sent once each (in
    order, `osl` tokens asked of each) instead of random ones, and `isl` is not needed. With
    `check` (the default) a failed gate fails the test, one line per reason, after the result
    is recorded; `check=False` returns it for the test to judge. An agentic-coding server's
    point replays traces: the last four start it as their `--inferbench-*` options do (None:
    the run's), `agentic_fast=False` on a fast run with InferenceX's duration and warmup.
    """
    _use(request.config)
    calls = 0  # every call's point gets a name of its own, one that failed included
    # A marked test's server starts at setup, as a recipe node's does: a failed start is an
    # error of the test's setup, before any of its code ran.
    marked: Server | None = (request.getfixturevalue("inferbench_server")
                             if names_server(request.node) else None)

    def run(isl: int | None = None, osl: int = 1024, conc: int = 1, *,
            prompts: Sequence[str] | None = None, request_rate: float | None = None,
            prompts_per_conc: int | None = None, seed: int | None = None,
            server: Server | None = None, check: bool = True,
            trajectory_start_min_ratio: float | None = None,
            trajectory_start_max_ratio: float | None = None,
            warmup_requests_per_lane: int | None = None,
            agentic_fast: bool | None = None) -> PointResult:
        nonlocal calls
        from ..loadgen.tokenizer import count_tokens
        from ..recipe.model import BenchPoint

        problems = _load_problems(isl=isl, osl=osl, conc=conc, prompts=prompts,
                                  request_rate=request_rate, prompts_per_conc=prompts_per_conc,
                                  seed=seed, server=server, check=check)
        state = get_session_state(request.config)
        replay = ReplayStart(trajectory_start_min_ratio, trajectory_start_max_ratio,
                             warmup_requests_per_lane, agentic_fast)
        problems += [f"{name}={_shown(value)}: expected {rule.expected}"
                     for name, value, rule in replay.numbers() if not rule.accepts(value)]
        problems += [] if problems else replay.conflicts(state.load)
        if problems:
            pytest.fail("inferbench_load: " + "; ".join(problems), pytrace=False)
        server = server or marked
        if server is None:
            pytest.fail(f"inferbench_load: mark the test with @pytest.mark.{MARKER}(...) or "
                        "pass server= (from inferbench_servers)", pytrace=False)
        texts = tuple(prompts or ())
        if isl is None and not texts:
            pytest.fail("inferbench_load: give isl (with osl and conc) or prompts",
                        pytrace=False)
        load = dataclasses.replace(
            replay.applied(state.load, state.settings.replay.fast),
            request_rate=math.inf if request_rate is None else float(request_rate),
            prompts_per_conc=state.load.prompts_per_conc if prompts_per_conc is None
            else prompts_per_conc, seed=state.load.seed if seed is None else seed)
        # A given prompt list is its own nominal ISL: the longest prompt, in words; the
        # record's `input_lens` hold what was counted for each request.
        nominal = isl if isl is not None else max(count_tokens(t) for t in texts)
        line = request.node.reportinfo()[1]
        point = BenchPoint(server=server.config, isl=nominal, osl=osl, conc=conc,
                           line=(line + 1) if isinstance(line, int) else 0, prompts=texts,
                           tag=_tag(request, calls))
        calls += 1
        record = run_bench_item(request.node, point, server.lease, load, fail=check)
        return PointResult(record=record, failures=record.gate_failures)

    return run


def _load_problems(*, isl: object, osl: object, conc: object, prompts: object,
                   request_rate: object, prompts_per_conc: object, seed: object,
                   server: object, check: object) -> list[str]:
    """What is wrong with `inferbench_load`'s arguments, one entry each, naming the argument;
    the numbers keep the rules their command-line options and recipe fields keep."""
    numbers: list[tuple[str, object, Rule]] = [
        ("isl", isl, TOKENS), ("osl", osl, TOKENS), ("conc", conc, CONCURRENCY),
        ("request_rate", request_rate, REQUEST_RATE),
        ("prompts_per_conc", prompts_per_conc, PROMPTS_PER_CONC), ("seed", seed, SEED)]
    # None leaves isl to the prompts and the rest to the run's settings; osl and conc have
    # defaults, so None is a value there, and a wrong one.
    problems = [f"{name}={_shown(value)}: expected {rule.expected}"
                for name, value, rule in numbers
                if (value is not None or name in ("osl", "conc")) and not rule.accepts(value)]
    # A str is a sequence too: "abc" would be three one-letter prompts.
    if prompts is not None and (isinstance(prompts, str | bytes)
                                or not isinstance(prompts, collections.abc.Sequence) or not prompts
                                or not all(isinstance(t, str) and t.strip() for t in prompts)):
        problems.append(f"prompts={_shown(prompts)}: expected a non-empty list of non-empty "
                        "prompt texts")
    if server is not None and not isinstance(server, Server):
        problems.append(f"server={_shown(server)}: expected a Server (from inferbench_servers "
                        "or inferbench_server)")
    if not isinstance(check, bool):
        problems.append(f"check={_shown(check)}: expected True or False")
    return problems


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@pytest.fixture
def inferbench_eval(request: pytest.FixtureRequest) -> Callable[..., EvalResult]:
    """`inferbench_eval(server=None) -> EvalResult`: GSM8K against the server (the marked one
    unless given), exactly as a recipe node's eval item: the same data, thresholds, files and
    verdict (skips without eval data, fails below the threshold)."""
    _use(request.config)

    def run(server: Server | None = None) -> EvalResult:
        from ..evals.item import run_eval_item

        if server is None:
            server = request.getfixturevalue("inferbench_server")
        state = get_session_state(request.config)
        return run_eval_item(request.node, server.config, server.spec, server.handle.base_url,
                             state.settings, state.start_context)

    return run


@pytest.fixture(scope="session")
def inferbench_results_dir(request: pytest.FixtureRequest) -> Path:
    """Where this run writes results (`--inferbench-results`)."""
    _use(request.config)
    return get_session_state(request.config).settings.results_dir


@pytest.fixture(scope="session")
def inferbench_run(request: pytest.FixtureRequest) -> RunInfo:
    """This run's id, backend, xdist worker, results directory and settings."""
    _use(request.config)
    state = get_session_state(request.config)
    settings = state.settings
    return RunInfo(run_id=state.run_id, backend=settings.backend,
                   simulated=settings.simulated,
                   worker_id=state.start_context.worker_id, results_dir=settings.results_dir,
                   settings=settings)


def uses_fixtures(item: pytest.Item) -> bool:
    names: Iterable[str] = getattr(item, "fixturenames", ())
    return any(name in FIXTURES for name in names)


def mark_server_users(config: pytest.Config, items: Sequence[pytest.Item]) -> None:
    """Collection: a test that names a server (marker or parameter) wants it: the pool keeps
    it for the next such test, `-n --dist loadgroup` keeps them on one worker with the recipe
    node's points. A name that matches no server is left for the fixture to report."""
    for item in items:
        if not (names_server(item) or uses_fixtures(item)):
            continue
        activation.engage(config)
        if WANTS_KEY in item.stash:
            continue
        try:
            server = item_server(config, item)
        except ServerSelectError:
            continue
        if server is not None:
            group_with_server(item, server_key(config, server))
