"""A point's files: the two InferenceX's pipeline has, and its requests' lines when asked.

- `points/<RESULT_FILENAME>.json`: the raw result exactly as InferenceX's vendored vLLM
  `benchmark_serving.py --save-result` writes it (every key, same names, units and types, in its
  order), plus one namespaced key, `inferbench`, holding everything else the plugin knows about
  the point (identity, per-token ITL, acceptance length, server metric deltas, client
  self-check, workload, `simulated`, gate failures). `{**raw, **raw["inferbench"]}` without
  the namespace key gives back the point's full record (`point_record`).
- `points/agg_<RESULT_FILENAME>.json`: what InferenceX's `utils/process_result.py` writes from
  the raw file with the workflow's environment (`agg_file`).
- `requests/<RESULT_FILENAME>.jsonl` (`--inferbench-save-requests`): one line per request.
- `gpu_metrics/<RESULT_FILENAME>.csv`: a real backend's GPU samples (nvidia-smi / amd-smi), as
  InferenceX's `gpu_metrics.csv`, which its `aggregate_power.py` reads with the raw file.
- an agentic point's `agentic/<RESULT_FILENAME>.json` and AIPerf artifacts (`agentic_files`).

`write_point_files` writes all of them. RESULT_FILENAME is
`recipe.BenchPoint.result_filename(runner_name)`: the workflow's template (`recipe.workflow`),
with the runner name last (`RUNNER_NAME` on a GitHub runner, else the runner type). It is the
files' name as it is wherever it fits and no other point of the run has it: a longer one keeps
its start and ends with a digest (`file_names.bounded`), one another point holds gets `_2`,
`_3`, ... (`PointNames`).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import agg_file, catalog
from .agentic_files import write_agentic_files
from .build import write_json_atomic, write_text_atomic
from .file_names import bounded
from .metrics import first_send

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from .metrics import RequestRecord
    from .record import JSONValue, PointRecord, Record

NAMESPACE = "inferbench"
AGG_PREFIX = "agg_"
RUNNER_NAME_ENV = "RUNNER_NAME"  # set by GitHub Actions on every runner

# benchmark_serving's keys in the order it writes them (setup, run, per-request lists, then
# the latency statistics, `catalog.inferencex_raw_latency_keys()`).
SETUP_KEYS = ("date", "backend", "model_id", "tokenizer_id", "best_of", "num_prompts",
              "request_rate", "burstiness", "max_concurrency")
RUN_KEYS = ("duration", "benchmark_start_time_unix", "benchmark_end_time_unix", "completed",
            "total_input_tokens", "total_output_tokens", "request_throughput",
            "request_goodput:", "output_throughput", "total_token_throughput",
            "input_lens", "output_lens")


def raw_keys() -> tuple[str, ...]:
    """Every key of a raw file but the namespace, in benchmark_serving's order."""
    return (*SETUP_KEYS, *RUN_KEYS, *catalog.inferencex_raw_latency_keys())


def runner_name(runner_type: str, explicit: str | None = None) -> str:
    """The runner name of RESULT_FILENAME: given, else GitHub's RUNNER_NAME, else the type."""
    return explicit or os.environ.get(RUNNER_NAME_ENV) or runner_type


def raw_result(record: Record) -> dict[str, JSONValue]:
    """The raw point file from the point's record (`results.build_result`)."""
    keys = raw_keys()
    missing = [key for key in keys if key not in record]
    if missing:
        raise KeyError(f"point record lacks benchmark_serving keys: {', '.join(missing)}")
    raw: dict[str, JSONValue] = {key: record[key] for key in keys}
    raw["backend"] = record["client_backend"]  # the client's backend, as benchmark_serving's
    raw[NAMESPACE] = {key: value for key, value in record.items()
                      if key not in raw or value != raw[key]}
    return raw


def point_record(raw: Record) -> dict[str, JSONValue]:
    """The full record back from a raw point file."""
    extra = raw.get(NAMESPACE)
    top = {key: value for key, value in raw.items() if key != NAMESPACE}
    return {**top, **extra} if isinstance(extra, Mapping) else top


def agg_result(raw: Record) -> dict[str, JSONValue]:
    """`process_result.py`'s output for a raw point file (`agg_file.agg_result`)."""
    return agg_file.agg_result(raw, point_record(raw))


def point_paths(points_dir: Path, result_filename: str) -> tuple[Path, Path]:
    """(raw file, agg file) of a point."""
    return (points_dir / f"{result_filename}.json",
            points_dir / f"{AGG_PREFIX}{result_filename}.json")


POINTS_DIR = "points"  # only the points' raw and agg files live here; run-level files beside it
REQUESTS_DIR = "requests"  # beside points/: `--inferbench-save-requests` writes one JSONL a point
GPU_METRICS_DIR = "gpu_metrics"  # beside points/: a point's GPU samples, when a tool took them


@dataclass(frozen=True)
class WrittenPoint:
    """What `write_point_files` wrote: the record as its files hold it (`result_filename` the
    name they have), and notes for what could not be written."""

    record: PointRecord
    notes: list[str]


class PointNames:
    """The names the points of this process hold in a results directory.

    A point is its nodeid and the name it asked for (a Python test's calls ask for names of
    their own); it keeps the name it was first given, so that its files are written again
    under it. No point takes another's name: a point's raw file goes into place only under a
    name no file has yet, whichever process of the run wrote that file, else under the first
    free one of `<name>_2`, `<name>_3`, ..., so the run has as many files as points."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], str] = {}

    @staticmethod
    def _key(record: PointRecord, name: str) -> tuple[str, str]:
        return (str(record.get("nodeid", "")), name)

    def held(self, record: PointRecord) -> str | None:
        """The name this point holds already (asked for, or given), or None."""
        return self._held.get(self._key(record, record.result_filename))

    def hold(self, record: PointRecord, name: str) -> None:
        """`record`'s point holds `name`: asked under the name it asked for or the one it got."""
        self._held[self._key(record, record.result_filename)] = name
        self._held[self._key(record, name)] = name


def _named(record: PointRecord, name: str) -> PointRecord:
    return record if record.result_filename == name else record.with_values(result_filename=name)


def _write_raw(points_dir: Path, record: PointRecord, names: PointNames | None) -> PointRecord:
    """The raw file, under the name the point holds or a free one (`PointNames`); the record
    as written."""
    asked = record.result_filename
    held = names.held(record) if names is not None else None
    if names is None or held is not None:
        record = _named(record, held or bounded(asked))
        # One line, as benchmark_serving.py writes it.
        write_json_atomic(point_paths(points_dir, record.result_filename)[0],
                          raw_result(record), indent=None)
        return record
    for count in itertools.count(1):
        named = _named(record, bounded(asked if count == 1 else f"{asked}_{count}"))
        raw_path = point_paths(points_dir, named.result_filename)[0]
        if write_json_atomic(raw_path, raw_result(named), indent=None, exclusive=True):
            names.hold(record, named.result_filename)
            return named
    raise AssertionError("unreachable: itertools.count never ends")


def write_point_files(results_dir: Path, record: PointRecord,
                      requests: Sequence[RequestRecord] | None = None,
                      mask: Callable[[str], str] = str,
                      names: PointNames | None = None,
                      gpu_metrics: str | None = None,
                      agentic_records: Sequence[RequestRecord] | None = None) -> WrittenPoint:
    """Every file of a point under `results_dir`, each written beside and renamed into place
    (readers never see half a file): the raw and agg files in `points/`, and given the point's
    `requests` (`--inferbench-save-requests`), their lines in `requests/`, each error masked
    by `mask`, and given its `gpu_metrics` (the GPU tool's CSV), that CSV in `gpu_metrics/`.
    Without `requests` (or `gpu_metrics`) that file is left as it is: a point's files are
    written again once its gates have run, its requests have not changed. Names are held to a length
    a file system takes (`file_names.bounded`); with `names`, a name another point of the run
    holds is never taken (`PointNames`). A file that cannot be written raises
    `build.WriteError` naming it. An agentic point also has InferenceX's agentic files
    (`agentic_files`), its requests' export given `agentic_records`."""
    points_dir = results_dir / POINTS_DIR
    record = _write_raw(points_dir, record, names)
    agg_path = point_paths(points_dir, record.result_filename)[1]
    notes: list[str] = []
    try:
        agg = agg_result(raw_result(record))
    except ZeroDivisionError:
        notes.append(f"no {agg_path.name}: a TPOT of 0 ms has no interactivity (InferenceX's "
                     "process_result.py fails on it too)")
    else:
        write_json_atomic(agg_path, agg)
    if "agentic" in record:
        write_agentic_files(results_dir, record, agentic_records, mask)
    if requests is not None:
        _write_request_lines(results_dir / REQUESTS_DIR / f"{record.result_filename}.jsonl",
                             requests, mask)
    if gpu_metrics is not None:
        write_text_atomic(gpu_metrics_path(results_dir, record.result_filename), (gpu_metrics,))
    return WrittenPoint(record, notes)


def gpu_metrics_path(results_dir: Path, result_filename: str) -> Path:
    return results_dir / GPU_METRICS_DIR / f"{result_filename}.csv"


def request_lines(records: Sequence[RequestRecord],
                  mask: Callable[[str], str] = str) -> list[dict[str, JSONValue]]:
    """One dict per request, in send order: times in seconds from the point's first send, TTFT
    and the gaps between streamed chunks (ITLs) in ms, tokens per chunk, status and error."""
    origin = first_send(records)
    lines: list[dict[str, JSONValue]] = []
    for index, r in enumerate(records):
        chunks = [float(t) for t in r.chunk_times]
        lines.append({
            "index": index,
            "request_id": r.request_id,
            "send_time_s": r.send_time - origin,
            "scheduled_time_s": (r.scheduled_time - origin if r.scheduled_time is not None
                                 else None),
            "status": "ok" if r.success else "error",
            "error": mask(r.error),  # a server's error text may echo a secret
            "input_tokens": r.input_tokens,
            "output_tokens": r.output_tokens,
            "ttft_ms": (chunks[0] - r.send_time) * 1000 if chunks else None,
            "itl_ms": [(b - a) * 1000 for a, b in itertools.pairwise(chunks)],
            # An empty chunk_tokens means one token per chunk (`RequestRecord`): written out.
            "chunk_tokens": r.tokens_per_chunk().tolist(),
            "e2el_ms": (r.end_time - r.send_time) * 1000,
        })
    return lines


def _write_request_lines(path: Path, records: Sequence[RequestRecord],
                         mask: Callable[[str], str]) -> None:
    """The JSONL, written beside and renamed into place (readers never see half a file)."""
    write_text_atomic(path, (json.dumps(line) + "\n" for line in request_lines(records, mask)))
