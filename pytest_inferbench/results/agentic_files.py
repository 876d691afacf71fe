"""An agentic point's files, as InferenceX's agentic job leaves them (agentic.md §4.1, §4.4).

Under `<results>/agentic/`:

- `<RESULT_FILENAME>/aiperf_artifacts/profile_export.jsonl`: one line per request, warmup
  included, as AIPerf writes it (`metadata` with the ns stamps and `benchmark_phase`,
  `metrics.<tag> = {value, unit}`, `error`), from `agentic.aiperf_request`, the view the
  plugin's aggregate counted;
- `<RESULT_FILENAME>/aiperf_artifacts/profile_export_aiperf.json`: the request counts
  `validate_agentic_result.py` reads, the theoretical prefix-cache hits, and AIPerf's
  `submission_valid` with its reasons under `metadata`;
- `<RESULT_FILENAME>/aiperf_artifacts/server_metrics_export.json`: what the point's `/metrics`
  scrapes said, as AIPerf exports a server's metrics (`agentic_server.export`; none for a
  server InferenceX has no adapter for);
- `<RESULT_FILENAME>.json`: the aggregate InferenceX-app ingests, what
  `process_agentic_result.py` makes of the three above with the job's environment (its
  `server_metrics` block: `agentic_server.server_block`).

So the tree's own scripts run unchanged on `<results>/agentic/<RESULT_FILENAME>` as RESULT_DIR.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from .agentic import ReplayMeta, aiperf_request
from .agentic_server import export, server_block
from .agg_file import ENV_KEY
from .build import write_json_atomic, write_text_atomic
from .record import mapping

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from .metrics import RequestRecord
    from .record import JSONValue, Record

AGENTIC_DIR = "agentic"
ARTIFACTS = "aiperf_artifacts"
EXPORT = "profile_export.jsonl"
AGGREGATE = "profile_export_aiperf.json"
SERVER_METRICS = "server_metrics_export.json"
ROUND_DIGITS = 5  # InferenceX rounds every float of its aggregate to 5 decimals


def result_dir(results_dir: Path, result_filename: str) -> Path:
    """The point's RESULT_DIR: what InferenceX's agentic scripts are pointed at."""
    return results_dir / AGENTIC_DIR / result_filename


def export_lines(records: Sequence[RequestRecord], meta: ReplayMeta,
                 mask: Callable[[str], str] = str) -> list[str]:
    """`profile_export.jsonl`'s lines, each error masked by `mask` (a server's error text may
    echo a secret)."""
    lines: list[str] = []
    for index, r in enumerate(records):
        q = aiperf_request(r, meta)
        measured: dict[str, float | int | None] = {
            "time_to_first_token": q.ttft_ms, "request_latency": q.latency_ms,
            "inter_token_latency": q.itl_ms, "input_sequence_length": q.isl,
            "output_sequence_length": q.osl, "usage_prompt_tokens": q.isl,
            "usage_completion_tokens": q.osl}
        units = {"input_sequence_length": "tokens", "output_sequence_length": "tokens",
                 "usage_prompt_tokens": "tokens", "usage_completion_tokens": "tokens"}
        line = {
            "metadata": {"session_num": index, "x_correlation_id": r.request_id,
                         "request_start_ns": q.start_ns, "request_end_ns": q.end_ns,
                         "benchmark_phase": "warmup" if q.warmup else "profiling",
                         "was_cancelled": False},
            "metrics": {} if q.error else {
                tag: {"value": value, "unit": units.get(tag, "ms")}
                for tag, value in measured.items() if value is not None},
            "error": {"message": mask(q.error)} if q.error else None,
        }
        lines.append(json.dumps(line) + "\n")
    return lines


def aiperf_aggregate(record: Record, meta: ReplayMeta) -> dict[str, JSONValue]:
    """`profile_export_aiperf.json`: the counts, the theoretical hits, the validity."""
    valid = mapping(mapping(record.get("agentic")).get("validity"))
    hit: dict[str, JSONValue] = {"sum": meta.hit_blocks, "count": meta.total_blocks, "unit": "%",
                                 "avg": (100.0 * meta.hit_blocks / meta.total_blocks
                                         if meta.total_blocks else None)}
    return {
        "request_count": {"avg": valid.get("successes"), "unit": "requests"},
        "error_request_count": {"avg": valid.get("errors"), "unit": "requests"},
        "completed_request_count": {"avg": valid.get("completed"), "unit": "requests"},
        "theoretical_prefix_cache_hit": hit,
        "metadata": {"submission_valid": valid.get("submission_valid"),
                     "invalid_reasons": valid.get("invalid_reasons", []),
                     "context_overflow_count": valid.get("context_overflow_count"),
                     "dataset": {"name": record.get("agentic_traces")}},
    }


def _rounded(value: JSONValue) -> JSONValue:
    """InferenceX's rounding: floats to 5 decimals, integral ones of magnitude >= 1 as ints."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return value
        value = round(value, ROUND_DIGITS)
        return int(value) if abs(value) >= 1 and value.is_integer() else value
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def agentic_env(record: Record) -> dict[str, str]:
    """The environment InferenceX's agentic job runs `process_agentic_result.py` with: the
    point's workflow environment plus what the agentic launcher exports."""
    env = {k: str(v) for k, v in mapping(record.get(ENV_KEY)).items()}
    backend = record.get("kv_offload_backend")
    name, _, version = str(backend or "").partition("@")
    env |= {"CONC": str(record.get("conc")), "MODEL": str(record.get("model")),
            "KV_OFFLOADING": str(record.get("kv_offloading") or "none"),
            "KV_OFFLOAD_BACKEND": name,
            "KV_OFFLOAD_BACKEND_METADATA": json.dumps(
                {"name": name, **({"version": version} if version else {})}) if name else "",
            "TOTAL_CPU_DRAM_GB": str(record.get("allocated_cpu_dram_gb") or 0),
            "IS_MULTINODE": env.get("IS_MULTINODE", "false")}
    return env


def _flag(value: str) -> bool:
    return value.lower() in ("1", "true", "yes", "on")


def _int(env: dict[str, str], name: str, default: int) -> int:
    return int(env[name]) if env.get(name) else default


def _shape(env: dict[str, str]) -> dict[str, JSONValue]:
    """The parallelism fields: a single node's, or both pools' of a multinode deployment (an
    aggregated one, without decode workers, counts its one pool only)."""
    tp, ep = _int(env, "TP", 1), _int(env, "EP_SIZE", 1)
    if not _flag(env["IS_MULTINODE"]):
        return {"tp": tp, "ep": ep, "dp_attention": env.get("DP_ATTENTION", "false"),
                "pp": _int(env, "PP_SIZE", 1), "dcp_size": _int(env, "DCP_SIZE", 1),
                "pcp_size": _int(env, "PCP_SIZE", 1)}
    sizes: dict[str, dict[str, int]] = {}
    for role in ("prefill", "decode"):
        at = role.upper() + "_"
        size = {"num_workers": _int(env, at + "NUM_WORKERS", 0), "tp": _int(env, at + "TP", 0),
                "pp": _int(env, at + "PP_SIZE", 1), "dcp_size": _int(env, at + "DCP_SIZE", 1),
                "pcp_size": _int(env, at + "PCP_SIZE", 1), "ep": _int(env, at + "EP", 1)}
        size["gpus"] = size["num_workers"] * size["tp"] * size["pp"] * size["pcp_size"]
        sizes[role] = size
    prefill, decode = sizes["prefill"], sizes["decode"]
    if not decode["gpus"]:
        decode |= {"tp": 0, "ep": 0, "pp": 1, "dcp_size": 1, "pcp_size": 1}
    attention = {role: env.get(f"{role.upper()}_DP_ATTN") or "false" for role in sizes}
    shape: dict[str, JSONValue] = {
        "tp": prefill["tp"] + decode["tp"], "ep": max(prefill["ep"], decode["ep"]),
        "dp_attention": "true" if any(map(_flag, attention.values())) else "false"}
    for role, size in sizes.items():
        shape |= {f"{role}_{key}": value for key, value in size.items() if key != "gpus"}
        shape |= {f"{role}_dp_attention": attention[role], f"num_{role}_gpu": size["gpus"]}
    if env.get("PREFILL_HARDWARE"):
        shape |= {"prefill_hw": env["PREFILL_HARDWARE"], "decode_hw": env["DECODE_HARDWARE"]}
    return shape


def result_json(record: Record) -> dict[str, JSONValue]:
    """`<RESULT_FILENAME>.json`: the aggregate as InferenceX's agentic job writes it."""
    env = agentic_env(record)
    block = mapping(record.get("agentic"))
    request = mapping(block.get("request_metrics"))
    accounting = mapping(block.get("request_accounting"))
    totals = mapping(block.get("totals"))
    backend = env["KV_OFFLOAD_BACKEND_METADATA"]
    agg: dict[str, JSONValue] = {
        "hw": env.get("RUNNER_TYPE", ""), "conc": int(env["CONC"]),
        "image": env.get("IMAGE", ""), "model": env["MODEL"],
        "infmax_model_prefix": env.get("MODEL_PREFIX", ""),
        "framework": env.get("FRAMEWORK", ""), "precision": env.get("PRECISION", ""),
        "spec_decoding": env.get("SPEC_DECODING") or "none",
        "disagg": _flag(env.get("DISAGG", "")), "scenario_type": "agentic-coding",
        "is_multinode": _flag(env["IS_MULTINODE"]), **_shape(env),
        "kv_offloading": env["KV_OFFLOADING"],
        "kv_offload_backend": json.loads(backend) if backend else None,
        "allocated_cpu_dram_gb": int(env["TOTAL_CPU_DRAM_GB"]),
        "num_requests_total": accounting.get("records_total"),
        "num_requests_successful": accounting.get("records_profiled"),
        "request_accounting": dict(accounting),
    }
    if env.get("ROUTER_METADATA"):
        agg["router"] = json.loads(env["ROUTER_METADATA"])
    if env.get("KV_P2P_TRANSFER"):
        agg["kv_p2p_transfer"] = env["KV_P2P_TRANSFER"]
    agg["dataset"] = {"name": record.get("agentic_traces")}
    server, warnings = server_block(server_export(record), env.get("FRAMEWORK", ""), totals)
    agg |= {"request_metrics": dict(request), "server_metrics": server,
            "kv_cache_pool_tokens": mapping(server["kv_cache"]).get("gpu_total_tokens")}
    if warnings:
        agg["warnings"] = list(warnings)
    rounded = _rounded(agg)
    assert isinstance(rounded, dict)
    return rounded


def server_export(record: Record) -> dict[str, JSONValue] | None:
    """The point's `server_metrics_export.json`, None where InferenceX would read none."""
    return export(mapping(record.get("server_metrics")),
                  agentic_env(record).get("FRAMEWORK", ""))


def write_agentic_files(results_dir: Path, record: Record,
                        records: Sequence[RequestRecord] | None,
                        mask: Callable[[str], str] = str) -> None:
    """The point's agentic files (module doc); its requests' export only given `records`
    (the files are written again after the gates, the requests unchanged)."""
    meta = ReplayMeta.from_json(mapping(mapping(record.get("agentic")).get("replay")))
    name = str(record.get("result_filename"))
    artifacts = result_dir(results_dir, name) / ARTIFACTS
    if records is not None:
        write_text_atomic(artifacts / EXPORT, export_lines(records, meta, mask))
    write_json_atomic(artifacts / AGGREGATE, aiperf_aggregate(record, meta))
    exported = server_export(record)
    if exported is not None:
        write_json_atomic(artifacts / SERVER_METRICS, exported)
    write_json_atomic(results_dir / AGENTIC_DIR / f"{name}.json", result_json(record))
