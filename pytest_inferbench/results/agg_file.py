"""A point's agg file: what InferenceX's current `utils/process_result.py` writes from its raw
file with the workflow's environment.

The environment is the point's (`recipe.BenchPoint.workflow_env`, kept in the record as
`inferencex_env`), so the file name and the agg file come from one source. In the script's order:
identity (`hw` is the runner type; `disagg` a boolean), `router` (the matrix's `{name, version}`)
and `kv_p2p_transfer` when the entry has them, then
- single-node: `is_multinode: false`, `tp`, `pp`, `dcp_size`, `pcp_size`, `ep`, `dp_attention`
  (the string the workflow passes) and per-GPU throughputs over `tp * pp * pcp_size`;
- multinode: `is_multinode: true`, each pool's parallelism and worker count (`decode_*` zero or
  one for an aggregated deployment, whose decode pool has no GPUs), `num_prefill_gpu`,
  `num_decode_gpu`, `tput_per_gpu` over every GPU, `output_tput_per_gpu` over the decode GPUs
  (every GPU when aggregated), `input_tput_per_gpu` over the prefill GPUs, and `prefill_hw` /
  `decode_hw` when the workers name their hardware;
then every `*_ms` key in seconds without the suffix and every TPOT key also as interactivity.
Then the power keys (`results.power.AGG_KEYS`) where the record has them: `power_valid`, and
when valid the energy and `aggregate_power.py`'s three (what it patches in from a GPU-metrics
CSV; a simulated point's come from the simulator's power model).
A simulated point's agg file carries one more key, `inferbench: {"simulated": true}`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from . import catalog
from .power import AGG_KEYS as POWER_KEYS
from .record import to_float, to_int

if TYPE_CHECKING:
    from .record import JSONValue, Record

NAMESPACE = "inferbench"
ENV_KEY = "inferencex_env"  # the record's copy of the workflow's environment for the point


def _env(record: Mapping[str, JSONValue]) -> dict[str, str]:
    env = record.get(ENV_KEY)
    if not isinstance(env, Mapping):
        raise KeyError(f"point record lacks {ENV_KEY}")
    return {str(key): str(value) for key, value in env.items()}


def _single_node(env: Mapping[str, str], total: float, output: float) -> dict[str, JSONValue]:
    tp, pp, pcp = int(env["TP"]), int(env["PP_SIZE"]), int(env["PCP_SIZE"])
    return {
        "is_multinode": False, "tp": tp, "pp": pp, "dcp_size": int(env["DCP_SIZE"]),
        "pcp_size": pcp, "ep": int(env["EP_SIZE"]), "dp_attention": env["DP_ATTENTION"],
        **catalog.per_gpu(total, output, tp * pp * pcp),
    }


def _multinode(env: Mapping[str, str], total: float, output: float) -> dict[str, JSONValue]:
    prefill_gpus, decode_gpus = int(env["PREFILL_GPUS"]), int(env["DECODE_GPUS"])
    has_decode = decode_gpus > 0
    data: dict[str, JSONValue] = {"is_multinode": True}
    for pool, active in (("prefill", True), ("decode", has_decode)):
        prefix = pool.upper() + "_"
        data |= {
            f"{pool}_tp": int(env[prefix + "TP"]) if active else 0,
            f"{pool}_pp": int(env[prefix + "PP_SIZE"]) if active else 1,
            f"{pool}_dcp_size": int(env[prefix + "DCP_SIZE"]) if active else 1,
            f"{pool}_pcp_size": int(env[prefix + "PCP_SIZE"]) if active else 1,
            f"{pool}_ep": int(env[prefix + "EP"]) if active else 0,
            f"{pool}_dp_attention": env[prefix + "DP_ATTN"],
            f"{pool}_num_workers": int(env[prefix + "NUM_WORKERS"]),
        }
    all_gpus = prefill_gpus + decode_gpus
    data |= {
        "num_prefill_gpu": prefill_gpus, "num_decode_gpu": decode_gpus,
        "tput_per_gpu": total / all_gpus,
        "output_tput_per_gpu": output / (decode_gpus if has_decode else all_gpus),
        "input_tput_per_gpu": (total - output) / prefill_gpus,
    }
    if env.get("PREFILL_HARDWARE"):
        data |= {"prefill_hw": env["PREFILL_HARDWARE"], "decode_hw": env["DECODE_HARDWARE"]}
    return data


def agg_result(raw: Record, record: Mapping[str, JSONValue]) -> dict[str, JSONValue]:
    """process_result.py's output for a raw point file and the point's full record."""
    env = _env(record)
    agg: dict[str, JSONValue] = {
        "hw": env["RUNNER_TYPE"],
        "conc": to_int(raw["max_concurrency"]),
        "image": env["IMAGE"],
        "model": raw["model_id"],
        "infmax_model_prefix": env["MODEL_PREFIX"],
        "framework": env["FRAMEWORK"],
        "precision": env["PRECISION"],
        "spec_decoding": env["SPEC_DECODING"],
        "disagg": env["DISAGG"].lower() == "true",
        "isl": int(env["ISL"]),
        "osl": int(env["OSL"]),
    }
    if env.get("ROUTER_METADATA"):
        agg["router"] = json.loads(env["ROUTER_METADATA"])
    if env.get("KV_P2P_TRANSFER"):
        agg["kv_p2p_transfer"] = env["KV_P2P_TRANSFER"]
    total, output = to_float(raw["total_token_throughput"]), to_float(raw["output_throughput"])
    multinode = env.get("IS_MULTINODE", "false").lower() == "true"
    agg |= _multinode(env, total, output) if multinode else _single_node(env, total, output)
    agg |= _derived_as_inferencex(raw)
    agg |= {key: record[key] for key in POWER_KEYS if key in record}
    if record.get("simulated"):
        agg[NAMESPACE] = {"simulated": True}
    return agg


def _derived_as_inferencex(raw: Mapping[str, JSONValue]) -> dict[str, float | None]:
    """Derived as the summary derives them. At a TPOT statistic of 0 (one request has no
    spread) process_result.py divides by zero and makes no agg file: neither do we."""
    derived = catalog.derived_values(raw)
    if any(value is None for value in derived.values()):
        raise ZeroDivisionError("a TPOT statistic of 0 ms has no interactivity")
    return derived
