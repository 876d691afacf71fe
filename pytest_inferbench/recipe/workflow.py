"""What InferenceX's benchmark workflows give a point: its RESULT_FILENAME and the environment
`utils/process_result.py` reads.

Single-node points follow `benchmark-tmpl.yml`; multinode points `benchmark-multinode-tmpl.yml`,
whose RESULT_FILENAME names a whole search-space row (every concurrency joined by `x`), and
whose launchers then name each concurrency's file `<RESULT_FILENAME>_<config>_conc<N>_gpus_<G>`,
with `_ctx_<prefill GPUs>_gen_<decode GPUs>` when disaggregated; the workflow reads the GPU
counts back from that name. The `<config>` slot is the launcher's recipe directory there; here it
is `n` and 8 hex digits of the plugin's server node name, because InferenceX's name alone is the
same for different entries (another image, other worker settings) and one point's files must
never overwrite another's.

Values are the strings GitHub Actions passes: booleans as `true`/`false`, a router as JSON, an
unset optional input as an empty string.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


def flag(value: bool) -> str:
    """A boolean as the workflow's expressions render it."""
    return "true" if value else "false"


def router_metadata(router: str | None) -> str:
    """`ROUTER_METADATA`: the matrix's `{name, version}` as JSON; empty without a router."""
    if not router:
        return ""
    name, _, version = router.partition("@")
    return json.dumps({"name": name, "version": version})


def _worker_name(env: Mapping[str, str], prefix: str) -> str:
    return "-".join((f"tp{env[prefix + 'TP']}", f"pp{env[prefix + 'PP_SIZE']}",
                     f"dcp{env[prefix + 'DCP_SIZE']}", f"pcp{env[prefix + 'PCP_SIZE']}",
                     f"ep{env[prefix + 'EP']}", f"dp{env[prefix + 'DP_ATTN']}",
                     f"nw{env[prefix + 'NUM_WORKERS']}"))


def node_slot(node_name: str) -> str:
    """The launcher's `<config>` slot: short, the same for every point of a server node."""
    return "n" + hashlib.sha256(node_name.encode()).hexdigest()[:8]


def result_filename(env: Mapping[str, str], *, conc: int, row_concurrencies: Sequence[int],
                    runner_name: str, node_name: str, extra: str = "") -> str:
    """RESULT_FILENAME of a point from its workflow env (`recipe.BenchPoint.workflow_env`);
    `extra` (a Python test's tag, a request-rate sweep's rate) comes last, so those points never
    share a recipe point's name."""
    head = f"{env['EXP_NAME']}_{env['PRECISION']}_{env['FRAMEWORK']}"
    tail = f"_disagg-{env['DISAGG']}_spec-{env['SPEC_DECODING']}"
    if env.get("IS_MULTINODE") == "true":
        concs = "x".join(str(value) for value in row_concurrencies)
        gpus = int(env["PREFILL_GPUS"]) + int(env["DECODE_GPUS"])
        name = (f"{head}_prefill-{_worker_name(env, 'PREFILL_')}"
                f"_decode-{_worker_name(env, 'DECODE_')}{tail}_conc{concs}_{runner_name}"
                f"_{node_slot(node_name)}_conc{conc}_gpus_{gpus}")
        if env["DISAGG"] == "true":
            name += f"_ctx_{env['PREFILL_GPUS']}_gen_{env['DECODE_GPUS']}"
    else:
        name = (f"{head}_tp{env['TP']}-pp{env['PP_SIZE']}-dcp{env['DCP_SIZE']}"
                f"-pcp{env['PCP_SIZE']}-ep{env['EP_SIZE']}-dpa{env['DP_ATTENTION']}{tail}"
                f"_conc{conc}_{runner_name}")
    return name + extra
