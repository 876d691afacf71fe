"""The result record of one point, and writing it atomically.

`build_result()` merges, in this order: the identity of the point (InferenceX agg field names
and readable aliases), the vLLM `benchmark_serving` keys with the per-token ITL, token
accounting and InferenceX aggregate keys from `metrics.summarize()`, the acceptance length when
the server is speculative, the server-side metrics, and the client self-check verdict.
`measurement_failures()` says why such a record must fail its test even without any gate.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import agentic, metrics, server_latency
from .agg_file import ENV_KEY
from .file_names import bounded
from .power import power_fields
from .record import PointRecord, mapping, number, strings, to_int

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..recipe.launch import ServerSpec
    from ..recipe.model import BenchPoint
    from .agentic import ReplayMeta
    from .measurement import PointMeasurement
    from .metrics import RequestRecord
    from .record import JSONValue, Record

SCHEMA_VERSION = 1
TIMINGS_NOT_MEANINGFUL = ("timings not meaningful: the simulated server ran at time scale 0 (as "
                          "fast as it can), so latencies and throughputs measure this machine, "
                          "not the model; use it for functional checks only")


def identity(point: BenchPoint, *, spec: ServerSpec | None, backend: str,
             image: str | None, simulated: bool, runner_name: str | None = None
             ) -> dict[str, JSONValue]:
    s = point.server
    image = image if image is not None else (spec.image if spec else s.image)
    # InferenceX's workflow environment for the point: its file name and agg file come from it.
    env = point.workflow_env(runner_name, image)
    return {
        "schema_version": SCHEMA_VERSION,
        "config_key": s.config_key,
        "server_node": s.node_name,
        "model": s.model,
        "served_model": spec.served_model if spec else s.model,
        "model_prefix": s.model_prefix,
        "infmax_model_prefix": s.model_prefix,
        "exp_name": point.exp_name,
        "framework": s.framework,
        "hw": s.runner,  # InferenceX: hw is the runner type
        "runner": s.runner,
        "hardware": s.hardware,
        "precision": s.precision,
        "tp": s.parallel.tp,
        "ep": s.parallel.ep,
        "dp_attention": s.parallel.dp_attn,
        "spec_decoding": s.spec_decoding,
        "disagg": s.disagg,
        "is_multinode": s.multinode,
        "isl": point.isl,
        "osl": point.osl,
        "conc": point.conc,
        "backend": backend,
        "image": image,
        "simulated": simulated,
        # The server's argv as its launch spec gives it ({port} unfilled): what
        # `python -m pytest_inferbench.sim calibrate` simulates a measured point with.
        "server_argv": list(spec.argv) if spec else None,
        "result_filename": env["RESULT_FILENAME"],
        ENV_KEY: dict(env),
        "recipe": f"{s.source}:{point.line}",
    }


# The per-request arrays of a point's record: its raw file keeps them; what travels to the
# xdist controller and into summary.json leaves them out (tens of thousands of numbers a point).
PER_REQUEST_KEYS = ("input_lens", "output_lens")


def build_result(point: BenchPoint, measurement: PointMeasurement, *,
                 spec: ServerSpec | None, backend: str, image: str | None = None,
                 goodput_slos: Mapping[str, float] | None = None,
                 runner_name: str | None = None) -> PointRecord:
    """One point's record. Per-GPU numbers divide by TP, as InferenceX does."""
    result = identity(point, spec=spec, backend=backend, image=image,
                      simulated=measurement.simulated, runner_name=runner_name)
    records = measurement.records
    replay = replay_meta(measurement, point.server.gpus)
    if replay is not None:  # an agentic point: its warmup is measured by nothing
        result.update(agentic_fields(records, replay))
        result["kv_offloading"] = point.server.offloading
        result["allocated_cpu_dram_gb"] = point.server.total_cpu_dram_gb
        result["kv_offload_backend"] = point.server.kv_offload_backend
        if any(r.warmup for r in records):
            records = [r for r in records if not r.warmup]
    summary = metrics.summarize(
        records, duration_s=measurement.duration_s,
        num_prompts=measurement.num_prompts if records is measurement.records else len(records),
        max_concurrency=measurement.max_concurrency,
        num_gpus=point.server.gpus, goodput_slos=goodput_slos)
    # benchmark_serving's setup keys: the client it would have been (completions: `vllm`).
    result["date"] = time.strftime("%Y%m%d-%H%M%S")
    chat = spec is not None and spec.client.chat
    result["client_backend"] = "openai-chat" if chat else "vllm"
    result["model_id"] = result["tokenizer_id"] = point.server.model
    result["best_of"] = 1
    result["burstiness"] = 1.0
    # The configured rate, as vLLM writes it ("inf" for a closed loop); what the client achieved
    # is `achieved_request_rate` and `achieved_concurrency`.
    result["request_rate"] = measurement.workload.get("request_rate", "inf")
    result.update(summary)
    result["rate_limited"] = result["request_rate"] != "inf"
    # A simulated server at time scale 0 streams as fast as it can: its intervals are no timings.
    result["time_scale"] = measurement.time_scale
    result["timings_meaningful"] = measurement.time_scale != 0
    if not result["timings_meaningful"]:
        result["notes"] = [TIMINGS_NOT_MEANINGFUL]
    started = measurement.started_unix
    if started is None:
        started = time.time() - measurement.duration_s
    result["benchmark_start_time_unix"] = started
    result["benchmark_end_time_unix"] = started + measurement.duration_s
    # Per request in send order; a failed request's output is 0 tokens, as vLLM counts it.
    if isinstance(records, metrics.StepRecords):  # all succeeded; counted by the simulator's words
        result["input_lens"] = records.input_tokens.tolist()
        result["output_lens"] = records.output_tokens.tolist()
    else:
        result["input_lens"] = [r.input_tokens for r in records]
        result["output_lens"] = [r.output_tokens if r.success else 0 for r in records]
    result["workload"] = dict(measurement.workload)
    if measurement.workload.get("kind") == "agentic-replay":  # which traces it replayed
        result["agentic_traces"] = measurement.workload.get("traces")
    result["token_counts_estimated"] = bool(measurement.workload.get("token_counts_estimated"))
    sources = ([] if isinstance(records, metrics.StepRecords)
               else sorted({r.token_source for r in records if r.token_source}))
    result["chunk_token_source"] = ",".join(sources)
    server = dict(measurement.server_metrics)
    al = server.get("acceptance_length")
    if point.server.speculative or al is not None:
        result["acceptance_length"] = al
        result["acceptance_length_source"] = server.get("acceptance_length_source")
        result["client_tokens_per_chunk"] = summary["mean_tokens_per_chunk"]
    result["server_metrics"] = server
    latency = mapping(server.get("latency_histograms"))
    if latency:  # the server exports latency histograms: how the client's view compares
        compared = server_latency.client_vs_server(summary, latency)
        result["client_vs_server_ms"] = dict(compared)
        for quantity in ("ttft", "itl"):
            result[f"client_minus_server_median_{quantity}_ms"] = compared.get(
                f"median_{quantity}_ms")
    result["client_check"] = dict(measurement.client_check)
    result["notes"] = [*strings(result.get("notes")), *measurement.notes]
    if measurement.expected_error:
        result["expected_error"] = dict(measurement.expected_error)
        result["expected_error_label"] = measurement.expected_error_label
    if measurement.power is not None:
        result.update(power_fields(
            measurement.power, duration_s=measurement.duration_s,
            total_input_tokens=to_int(summary["total_input_tokens"]),
            total_output_tokens=to_int(summary["total_output_tokens"])))
    return PointRecord(result)


def replay_meta(measurement: PointMeasurement, gpus: int) -> ReplayMeta | None:
    """What an agentic point's aggregate needs besides its records: the backend's, else
    (a replay that says only that it is one) the measurement's own clock and duration,
    without the theoretical prefix-cache hits."""
    workload = measurement.workload
    if measurement.replay is not None or workload.get("kind") != "agentic-replay":
        return measurement.replay
    duration = workload.get("duration_s")
    return agentic.ReplayMeta(
        num_gpus=gpus, clock_start=metrics.first_send(measurement.records),
        start_unix=measurement.started_unix or 0.0,
        duration_s=float(duration) if isinstance(duration, (int, float)) else 0.0)


def agentic_fields(records: Sequence[RequestRecord], meta: ReplayMeta
                   ) -> dict[str, JSONValue]:
    """An agentic point's InferenceX aggregate (`agentic`, nested as InferenceX has it) and
    its headline numbers as flat keys the gates, the report and the baseline read."""
    block = agentic.aggregate(records, meta)
    request = mapping(block["request_metrics"])
    latency = mapping(request.get("latency"))
    norm = mapping(latency.get("e2e_norm_intvty"))
    per_gpu = mapping(mapping(request.get("throughput")).get("per_gpu"))
    valid = mapping(block["validity"])
    return {
        "agentic": block,
        "p90_e2e_norm_intvty": norm.get("p90"),
        "agentic_p90_intvty": mapping(latency.get("intvty")).get("p90"),
        "agentic_tput_per_gpu": per_gpu.get("total_tput_tps"),
        "mean_qps": mapping(request.get("qps")).get("mean"),
        "submission_valid": 1 if valid.get("submission_valid") else 0,
        "invalid_reasons": valid.get("invalid_reasons", []),
    }


# A simulated server whose step deliveries ran later than its model's clock by more than this,
# on average over a point, served timings the model did not predict: the point is not a valid
# measurement of the simulation.
MAX_MEAN_DELIVERY_LAG_S = 0.010


def measurement_failures(result: Record) -> list[str]:
    """Why the point's numbers cannot be trusted: an agentic replay a lost server stopped,
    client self-check, token accounting.

    A verdict marked `not_applicable` is not a failure: the simulator at time scale 0 streams
    as fast as it can, so its intervals are not timings the client's lag could have distorted.
    """
    failures: list[str] = []
    fault = mapping(mapping(result.get("agentic")).get("replay")).get("fault")
    if fault:  # a request lost the server: what follows it was never measured
        failures.append(f"the agentic replay stopped early: {fault}")
    check = mapping(result.get("client_check"))
    if check and not check.get("ok", True) and not check.get("not_applicable"):
        failures.append(str(check.get("reason") or "client self-check failed"))
    lag = mapping(mapping(result.get("server_metrics")).get("delivery_lag"))
    steps, mean_s = number(lag.get("steps")), number(lag.get("mean_s")) or 0.0
    if steps and mean_s > MAX_MEAN_DELIVERY_LAG_S:
        failures.append(
            f"not a valid measurement: the simulated server fell behind its own clock by "
            f"{mean_s * 1e3:.1f} ms per step on average over {steps:.0f} steps "
            f"({number(lag.get('steps_over_5ms')) or 0:.0f} late by more than 5 ms; largest lag "
            f"{(number(lag.get('max_s_since_start')) or 0.0) * 1e3:.0f} ms) > "
            f"{MAX_MEAN_DELIVERY_LAG_S * 1e3:.0f} ms: the machine could not keep up")
    mismatched = result.get("token_mismatch_requests") or 0
    # Words of a real model's output only estimate its tokens: no cross-check to fail.
    estimated = "approximate" in str(result.get("chunk_token_source") or "")
    if mismatched and not estimated:
        failures.append(
            f"token accounting: {mismatched} request(s) where usage.completion_tokens differs "
            "from the tokens streamed (chunk tokens counted by "
            f"{result.get('chunk_token_source')})")
    return failures


_FLAT = frozenset({int, bool, str, type(None)})  # JSON as they are
_NUMBERS = frozenset({int, float, bool})


def _jsonable(value: object) -> object:
    """Builtin types only; non-finite floats become null (JSON has no NaN)."""
    # Exact builtin types first: most values of a record are, and the Mapping check is an
    # abstract-class lookup.
    kind = type(value)
    if kind in _FLAT:
        return value
    if kind is float:
        return value if math.isfinite(value) else None  # type: ignore[arg-type]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        # A point's per-request arrays hold tens of thousands of numbers: one look at their
        # types (and, for floats, their finiteness) instead of a call per element.
        kinds = set(map(type, value))
        if kinds <= _FLAT or (kinds <= _NUMBERS and all(map(math.isfinite, value))):
            return list(value)
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        finite = value.dtype.kind == "f" and bool(np.isfinite(value).all())
        if value.dtype.kind in "iub" or finite:
            return value.tolist()  # builtin numbers, no NaN to replace
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def write_json_atomic(path: Path, data: object, *, indent: int | None = 2,
                      exclusive: bool = False) -> bool:
    """Write JSON to a temp file beside `path`, then rename: readers never see half a file.

    Every JSON artifact of the plugin (point results, summary.json, baselines, eval results)
    goes through here: builtin types only, non-finite floats as null. `indent=None` writes one
    line, as vLLM's `benchmark_serving.py` writes its raw result, with the C encoder (about
    five times faster on a point's per-request arrays than the indenting Python one).
    `exclusive` and what it returns: `write_text_atomic`.
    """
    return write_text_atomic(
        path, [json.dumps(_jsonable(data), indent=indent, allow_nan=False), "\n"],
        exclusive=exclusive)


class WriteError(OSError):
    """A results file that could not be written (a full disk, a directory that cannot be
    written): the message names the file and says why, in one line."""

    def __init__(self, path: Path, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause), str(path))

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def write_text_atomic(path: Path, parts: Iterable[str], *, exclusive: bool = False) -> bool:
    """Write `parts` to a temp file beside `path`, then rename; the temp file goes on any error.

    The one way the plugin writes a results file (JSON through `write_json_atomic`, request
    lines as JSONL). With `exclusive`, a file already named `path` is left as it is and
    nothing is written (False): the file is linked into place, so two writers never take one
    name. A failure to write raises `WriteError` naming `path`.
    """
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # The writer's pid in the name: the next run removes what a killed writer left
        # (`run_dir.remove_stale_temp_files`). Bounded: `path`'s own name may use the most a
        # file system takes.
        fd, tmp = tempfile.mkstemp(prefix=f".{bounded(path.name)}.{os.getpid()}.",
                                   suffix=".tmp", dir=path.parent)
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide results from the rest of the team
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.writelines(parts)
        if not exclusive:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)  # a rename would replace a file of that name
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: take the name, then fill it
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            except FileExistsError:
                return False
            os.replace(tmp, path)
        return True
    except OSError as exc:
        raise WriteError(path, exc) from None
    finally:
        if tmp is not None:  # gone after a rename; the link's second name after a link
            Path(tmp).unlink(missing_ok=True)
