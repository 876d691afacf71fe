"""What both agentic replays (`http_replay` over HTTP, `sim` in process) say alike: which
traces a point replays and how its result describes the replay.

The traces are the file `--inferbench-traces` names, else the seeded synthetic ones
(`loadgen/synthetic_traces.py`, default settings, seed 0); the result says which
(`agentic_traces`), with the replay's lanes, duration, plays and theoretical cache-hit rate.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..loadgen.synthetic_traces import SyntheticTraceSettings, write_synthetic_traces
from ..loadgen.trace_sessions import sessions
from ..loadgen.traces import TraceError, load_traces
from ..results.agentic import ReplayMeta
from .base import PointNotMeasuredError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..loadgen.replay_schedule import ReplayConfig, ReplayedRequest
    from ..loadgen.trace_sessions import SessionTree
    from ..results.record import JSONValue

SYNTHETIC_SEED = 0


def replay_traces(path: Path | None) -> tuple[str, tuple[SessionTree, ...]]:
    """(what the result calls the source, the session trees) of `path` or of the synthetic
    traces; a bad file raises PointNotMeasuredError with every problem, file:line each."""
    if path is None:
        with tempfile.TemporaryDirectory(prefix="inferbench-traces-") as tmp:
            settings = SyntheticTraceSettings(seed=SYNTHETIC_SEED)
            traces = load_traces(write_synthetic_traces(Path(tmp), settings))
        label = f"synthetic (seed {SYNTHETIC_SEED}, {len(traces)} traces)"
    else:
        try:
            traces = load_traces(path)
        except TraceError as exc:
            raise PointNotMeasuredError(f"--inferbench-traces {path}:\n{exc}") from None
        label = str(path)
    trees = tuple(sessions(t) for t in traces)
    trees = tuple(t for t in trees if t.streams.get(t.trace.id))  # a trace with no root turn
    if not trees:
        raise PointNotMeasuredError(f"--inferbench-traces {path}: no trace has a request")
    return label, trees


def replay_note(label: str, settings: ReplayConfig, lanes: int) -> str:
    return f"agentic replay of {label} traces for {settings.duration_s:g} s at {lanes} lanes"


def replay_workload(label: str, trees: Sequence[SessionTree], lanes: int,
                    settings: ReplayConfig, requests: Sequence[ReplayedRequest], plays: int,
                    plays_completed: int, token_source: str) -> dict[str, JSONValue]:
    """The result's description of an agentic replay (its `workload`)."""
    hit, total = _theoretical(requests)
    return {
        "kind": "agentic-replay", "traces": label, "trace_count": len(trees),
        "lanes": lanes, "duration_s": settings.duration_s,
        "delay_scale": settings.delay_scale, "plays": plays,
        # Where each lane's first tree started and its warmup (§3.3): the fast mode's one.
        "trajectory_start": list(settings.trajectory_start),
        "warmup_requests_per_lane": settings.warmup_per_lane,
        "plays_completed": plays_completed,
        # agentic.md §4.2: theoretical_prefix_cache_hit sum / count, over the requests
        # profiled (a primer's assumes the history it stands for was sent).
        "theoretical_cache_hit_rate": hit / total if total else None,
        "token_source": token_source,
        "token_counts_estimated": token_source.endswith("(approximate)"),
    }


def replay_meta(num_gpus: int, settings: ReplayConfig, requests: Sequence[ReplayedRequest], *,
                clock_start: float, start_unix: float, cancelled: bool = False,
                fault: str = "") -> ReplayMeta:
    """What the agentic aggregate (`results/agentic.py`) needs besides the records: `requests`
    in the records' order, `clock_start` the records' clock at `start_unix`."""
    hit, total = _theoretical(requests)
    return ReplayMeta(
        num_gpus=num_gpus, clock_start=clock_start, start_unix=start_unix,
        duration_s=settings.duration_s, hit_blocks=hit, total_blocks=total,
        cancelled=cancelled, fault=fault, expected_output=tuple(q.output_length for q in requests))


def _theoretical(requests: Sequence[ReplayedRequest]) -> tuple[int, int]:
    """The theoretical prefix-cache hit and total blocks of the profiled requests."""
    profiled = [q for q in requests if not q.warmup]
    return sum(q.hit_blocks for q in profiled), sum(q.total_blocks for q in profiled)
