"""A node's eval directory as InferenceX's eval tools read an eval job's workspace.

`<results>/evals/<node>/` holds lm-eval's `results_<ts>.json` and `samples_gsm8k_<ts>.jsonl`
(written by the runner) and `meta_env.json` (written here) with the keys and types of
`benchmark_lib.sh`'s `append_lm_eval_summary`: identity (`framework`, `precision`,
`spec_decoding`, `tp`, `ep`, `dp_attention` as JSON booleans, `conc`), the prefill/decode
topology (a single node: both sides are the node), `model`, `infmax_model_prefix`, `hw` (the
runner type) and `isl`/`osl` as strings. So `utils/evals/validate_scores.py`, run in that
directory, finds one results file and the model prefix, and resolves thresholds
`models[prefix][task] -> default[task] -> --min-score` as the plugin's gate does.

The results file also carries `inferbench: {"simulated": ..., ...}`: a score of the
simulator's answer oracle can never pass for a model's accuracy.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..results.build import write_json_atomic

if TYPE_CHECKING:
    from pathlib import Path

    from ..recipe.model import ServerConfig
    from ..results.record import JSONValue
    from .runner import EvalResult

META_ENV = "meta_env.json"


def meta_env(server: ServerConfig, result: EvalResult, model: str) -> dict[str, JSONValue]:
    plan, p = result.plan, server.parallel
    conc = plan.concurrency if plan else result.concurrency
    return {
        "is_multinode": False,
        "framework": server.framework,
        "precision": server.precision,
        "spec_decoding": server.spec_decoding,
        "tp": p.tp,
        "conc": conc,
        "ep": p.ep,
        "dp_attention": p.dp_attn,
        "prefill_tp": p.tp,
        "prefill_ep": p.ep,
        "prefill_dp_attention": p.dp_attn,
        "prefill_num_workers": 1,
        "decode_tp": p.tp,
        "decode_ep": p.ep,
        "decode_dp_attention": p.dp_attn,
        "decode_num_workers": 1,
        "model": model,
        "infmax_model_prefix": server.model_prefix,
        "hw": server.runner,
        "isl": str(plan.isl if plan else 0),
        "osl": str(plan.osl if plan else 0),
    }


def finish_eval_dir(server: ServerConfig, result: EvalResult, model: str, *,
                    simulated: bool, runner: str) -> Path | None:
    """Write meta_env.json beside the results file and stamp the results file; returns the
    meta_env path (None when the runner wrote no results file)."""
    if result.results_file is None:
        return None
    out_dir = result.results_file.parent
    data = json.loads(result.results_file.read_text(encoding="utf-8"))
    data["inferbench"] = {
        "simulated": simulated,
        "runner": runner,
        "node": server.node_name,
        "config_key": server.config_key,
        "eval_context_length": result.plan.context_length if result.plan else None,
        "max_tokens": result.plan.max_tokens if result.plan else None,
    }
    write_json_atomic(result.results_file, data)
    path = out_dir / META_ENV
    write_json_atomic(path, meta_env(server, result, model))
    return path
