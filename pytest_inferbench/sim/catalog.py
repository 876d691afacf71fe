"""Catalogs as data: hardware, model architectures, checkpoints, framework profiles.

The YAML files in `sim/catalog/` (and each framework's `simulator` profile in its registry
entry, `frameworks/entries/`) hold only measured or published numbers; everything derived
(weight bytes, active parameters, KV bytes per token) is computed here from the architecture,
so a new model is a few lines of config, not a hand-typed size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import Any

from ..frameworks import registry
from ..util.yamllines import load_data
from .attention import AttentionShape, attention_params

# Bytes per stored weight. MX formats carry one 8-bit scale per 32 elements.
DTYPE_BYTES: dict[str, float] = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "mxfp8": 1.0 + 1.0 / 32,
    "mxfp4": 0.5 + 1.0 / 32,
    "fp4": 0.5 + 1.0 / 32,
    "nvfp4": 0.5 + 1.0 / 16,  # fp8 scale per 16 (plus a per-tensor fp32 scale)
    "int4": 0.5 + 2.0 / 32,  # weight-only, bf16 scale per group of 32 (compressed-tensors)
}
# The tensor-core dtype a stored dtype computes in, when the hardware supports it.
COMPUTE_DTYPE: dict[str, str] = {
    "bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "mxfp8": "fp8", "mxfp4": "fp4", "fp4": "fp4",
    "nvfp4": "fp4", "int4": "bf16",  # W4A16: dequantized to bf16 in the GEMM
}
KV_DTYPE_BYTES: dict[str, float] = {
    "auto": 2.0, "bf16": 2.0, "fp16": 2.0, "float16": 2.0, "bfloat16": 2.0,
    "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_e4m3fnuz": 1.0,
}
PARTS = ("attention", "dense_ffn", "shared_experts", "experts", "router", "embedding", "lm_head")


class CatalogError(ValueError):
    """An unknown name or a malformed catalog entry; the message lists the known names."""


@dataclass(frozen=True)
class Hardware:
    name: str
    hbm_bytes: float
    hbm_bytes_per_s: float
    peak_flops: dict[str, float]  # dtype -> FLOP/s
    link_bytes_per_s: float
    achievable_flops: float
    achievable_hbm: float
    scaleup_gpus: int  # GPUs sharing the link_bytes_per_s fabric (NVLink / IF domain)
    nic_bytes_per_s: float  # scale-out RDMA bandwidth one way per GPU
    host_link_bytes_per_s: float  # CPU DRAM <-> GPU one way per GPU (PCIe / NVLink-C2C)
    collective_base_s: float  # small-message all-reduce latency: base + per peer (hardware.yaml)
    collective_per_peer_s: float

    def supports(self, compute_dtype: str) -> bool:
        return compute_dtype in self.peak_flops

    def collective_latency_s(self, gpus: int) -> float:
        """Latency of one all-reduce (or one MoE dispatch / combine) among `gpus` GPUs of the
        scale-up domain, its bytes aside; none on one GPU."""
        if gpus <= 1:
            return 0.0
        return self.collective_base_s + self.collective_per_peer_s * (gpus - 1)


@dataclass(frozen=True)
class Architecture:
    name: str
    layers: int
    hidden: int
    dense_layers: int
    dense_ffn: int
    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int
    shared_ffn: int
    vocab: int
    tied_embeddings: bool
    attention: AttentionShape
    # Native context length in tokens (the HF config's max_position_embeddings): what an
    # engine serves when the launch argv names no context length.
    context: int
    eagle_fusion_inputs: int = 0
    mtp_layers: int = 0  # native multi-token-prediction layers (DeepSeek-style MTP)

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def expert_params(self) -> int:
        """One routed expert of one layer (gate, up, down)."""
        return 3 * self.hidden * self.expert_ffn

    def part_params(self) -> dict[str, int]:
        """Parameter count of each part of the decoder."""
        h = self.hidden
        dense = self.dense_layers * 3 * h * self.dense_ffn + self.eagle_fusion_inputs * h * h
        return {
            "attention": attention_params(self.attention, layers=self.layers,
                                           hidden=self.hidden),
            "dense_ffn": dense,
            "shared_experts": self.moe_layers * self.shared_experts * 3 * h * self.shared_ffn,
            "experts": self.moe_layers * self.experts * self.expert_params,
            "router": self.moe_layers * h * self.experts,
            "embedding": 0 if self.tied_embeddings else self.vocab * h,
            "lm_head": self.vocab * h,
        }

    @property
    def total_params(self) -> int:
        return sum(self.part_params().values())

    @property
    def active_params(self) -> int:
        """Parameters one token multiplies through (the embedding is a lookup)."""
        p = self.part_params()
        routed = self.moe_layers * self.top_k * self.expert_params
        return p["attention"] + p["dense_ffn"] + p["shared_experts"] + p["router"] + routed + p[
            "lm_head"]

    def kv_bytes_per_token(self, kv_dtype_bytes: float) -> float:
        """KV bytes one token stores over all layers and all GPUs (no indexer cache)."""
        return self.layers * self.attention.kv_elems_per_token_layer * kv_dtype_bytes


@dataclass(frozen=True)
class Checkpoint:
    name: str
    architecture: Architecture
    dtypes: dict[str, str]  # part -> stored dtype
    draft_for: str | None
    context: int  # native context length: the checkpoint's own, else its architecture's

    def part_bytes(self) -> dict[str, float]:
        params = self.architecture.part_params()
        return {part: params[part] * DTYPE_BYTES[self.dtypes[part]] for part in PARTS}

    @property
    def weight_bytes(self) -> float:
        return sum(self.part_bytes().values())


@dataclass(frozen=True)
class Framework:
    """A framework's simulator profile: what the roofline cannot derive. Its registry entry's
    `simulator` mapping gives it:

    - step_overhead_ms: fixed cost of every engine step that is not a layer's HBM or compute
      time: kernel launches, MoE routing, sampling, scheduler; not the latency of the per-layer
      all-reduces (modelled separately from the hardware: `Hardware.collective_latency_s`, 2
      per layer, only when TP > 1)
    - allreduce_bytes_per_elem: activation bytes sent per hidden element (2 = bf16)
    - hbm_efficiency: achieved fraction of peak HBM bandwidth for weight/KV streaming
    - compute_efficiency: achieved fraction of dense peak FLOP/s (prefill and verify GEMMs) on
      the `calibrated_on` chip; other chips scale it by their realizable-flops fraction
      relative to that chip's
    - defaults: engine arguments when the argv does not give them
    - defaults_by_memory: the engine's own defaults that depend on the GPU's memory, a list of
      `{min_gib: G, <argument>: value, ...}`: each entry whose G the chip's HBM (GiB, as the
      engine reads it) reaches overrides `defaults`, later entries last
    - kv_transfer: disaggregated serving, the prefill -> decode KV-cache transfer. overlap:
      true when the prefill instance sends each chunk's KV as that chunk completes (only the
      last chunk's is left after the prefill), false when the transfer starts once the whole
      prompt is prefilled; latency_ms: fixed cost per transfer (completion polling,
      notification, the decode side picking it up; assumption: 1 ms, no public measurement);
      efficiency: achieved fraction of the link's line rate for the KV pages (assumption:
      0.8, as hbm_efficiency; not measured)
    """

    name: str
    step_overhead_s: float
    allreduce_bytes_per_elem: float
    hbm_efficiency: float
    compute_efficiency: float
    calibration_achievable_flops: float  # realizable flops fraction of the fitted-on chip
    defaults: dict[str, Any]
    kv_transfer_overlap: bool  # each prefill chunk's KV is sent as the chunk completes
    kv_transfer_latency_s: float
    kv_transfer_efficiency: float
    memory_defaults: tuple[tuple[float, dict[str, Any]], ...] = ()  # (min GiB, overrides)

    def defaults_on(self, hw: Hardware) -> dict[str, Any]:
        """`defaults` as the engine sets them on this chip (its memory tiers applied)."""
        out = dict(self.defaults)
        gib = hw.hbm_bytes / 2**30
        for min_gib, overrides in self.memory_defaults:
            if gib >= min_gib:
                out.update(overrides)
        return out


@cache
def _load(filename: str) -> dict[str, Any]:
    folder = resources.files("pytest_inferbench.sim").joinpath("catalog")
    text = folder.joinpath(filename).read_text()
    data = load_data(text)
    if not isinstance(data, dict):
        raise CatalogError(f"catalog/{filename}: expected a mapping at the top")
    return data


def _pick(kind: str, table: dict[str, Any], name: str) -> tuple[str, Any]:
    """Exact name first, then case-insensitive; else an error listing the known names."""
    if name in table:
        return name, table[name]
    folded = {key.lower(): key for key in table}
    key = folded.get(name.lower())
    if key is None:
        raise CatalogError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")
    return key, table[key]


def hardware_names() -> list[str]:
    return sorted(_load("hardware.yaml")["hardware"])


def checkpoint_names() -> list[str]:
    return sorted(_load("models.yaml")["checkpoints"])


def framework_names() -> list[str]:
    return registry.names()


@cache
def hardware(name: str) -> Hardware:
    key, d = _pick("hardware", _load("hardware.yaml")["hardware"], name)
    return Hardware(
        name=key,
        hbm_bytes=float(d["hbm_gb"]) * 1e9,
        hbm_bytes_per_s=float(d["hbm_tb_s"]) * 1e12,
        peak_flops={k: float(v) * 1e12 for k, v in d["peak_tflops"].items()},
        link_bytes_per_s=float(d["link_gb_s"]) * 1e9,
        achievable_flops=float(d["achievable"]["flops"]),
        achievable_hbm=float(d["achievable"]["hbm"]),
        scaleup_gpus=int(d["scaleup_gpus"]),
        nic_bytes_per_s=float(d["nic_gb_s"]) * 1e9,
        host_link_bytes_per_s=float(d["host_link_gb_s"]) * 1e9,
        collective_base_s=float(d["collective_us"]["base"]) / 1e6,
        collective_per_peer_s=float(d["collective_us"]["per_peer"]) / 1e6,
    )


def _context(where: str, value: Any) -> int:
    """A catalog `context` (native context length, tokens): a whole number of at least 2."""
    if value is None:
        raise CatalogError(f"catalog/models.yaml: {where} has no `context` (its native context "
                           "length in tokens, the HF config's max_position_embeddings)")
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise CatalogError(f"catalog/models.yaml: {where}: `context` must be a whole number of "
                           f"tokens >= 2, got {value!r}")
    return value


@cache
def architecture(name: str) -> Architecture:
    key, d = _pick("architecture", _load("models.yaml")["architectures"], name)
    return Architecture(
        name=key,
        layers=int(d["layers"]), hidden=int(d["hidden"]),
        dense_layers=int(d["dense_layers"]), dense_ffn=int(d["dense_ffn"]),
        experts=int(d["experts"]), top_k=int(d["top_k"]), expert_ffn=int(d["expert_ffn"]),
        shared_experts=int(d["shared_experts"]), shared_ffn=int(d["shared_ffn"]),
        vocab=int(d["vocab"]), tied_embeddings=bool(d["tied_embeddings"]),
        attention=AttentionShape.from_catalog(d),
        context=_context(f"architecture {key}", d.get("context")),
        eagle_fusion_inputs=int(d.get("eagle_fusion_inputs", 0)),
        mtp_layers=int(d.get("mtp_layers", 0)),
    )


def mtp_architecture(arch: Architecture) -> Architecture:
    """The native MTP module as a draft model: one MoE decoder layer of the target with the
    2h -> h projection of [embedding; hidden state], sharing the target's embedding and lm_head
    (DeepSeek-V3 report §2.2; GLM-5, Qwen3.5 and DeepSeek-V4 ship the same kind of layer)."""
    shape = arch.attention
    compressed = shape.compressed
    if compressed:  # one layer: count it as a CSA layer (assumption)
        compressed = {**compressed, "csa_layers": arch.mtp_layers, "hca_layers": 0}
    return replace(
        arch, name=f"{arch.name}-MTP", layers=arch.mtp_layers, dense_layers=0, dense_ffn=0,
        tied_embeddings=True, eagle_fusion_inputs=2, mtp_layers=0,
        attention=replace(shape, linear=None, sliding=None, sparse=None, compressed=compressed))


def mtp_draft(target: Checkpoint) -> Checkpoint:
    """The target checkpoint's own MTP layer as a draft checkpoint (same dtypes)."""
    arch = target.architecture
    if not arch.mtp_layers:
        raise CatalogError(f"{arch.name} has no native MTP layer; name a draft model")
    return Checkpoint(name=f"{target.name} (MTP layer)", architecture=mtp_architecture(arch),
                      dtypes=dict(target.dtypes), draft_for=arch.name, context=target.context)


@cache
def checkpoint(name: str) -> Checkpoint:
    """A checkpoint by its hub name (`amd/MiniMax-M3-MXFP4`), or by the part after the `/`."""
    table = _load("models.yaml")["checkpoints"]
    by_base = {key.split("/")[-1].lower(): key for key in table}
    base = name.rstrip("/").split("/")[-1].lower()
    if name not in table and name.lower() not in {k.lower() for k in table} and base in by_base:
        name = by_base[base]
    key, d = _pick("model", table, name)
    dtypes = {part: str(d["dtypes"].get(part, d["dtypes"]["default"])) for part in PARTS}
    for part, dtype in dtypes.items():
        if dtype not in DTYPE_BYTES:
            raise CatalogError(f"checkpoint {key}: {part} dtype {dtype!r} unknown; "
                               f"known: {', '.join(DTYPE_BYTES)}")
    arch = architecture(str(d["architecture"]))
    return Checkpoint(name=key, architecture=arch, dtypes=dtypes, draft_for=d.get("draft_for"),
                      context=_context(f"checkpoint {key}", d["context"]) if "context" in d
                      else arch.context)


def framework(name: str) -> Framework:
    """A framework's simulator profile, from its registry entry (`frameworks/entries/`)."""
    try:
        entry = registry.get(name)
    except registry.FrameworkError as exc:
        raise CatalogError(str(exc)) from None
    d = entry.simulator
    return Framework(
        name=entry.name,
        step_overhead_s=float(d["step_overhead_ms"]) / 1e3,
        allreduce_bytes_per_elem=float(d["allreduce_bytes_per_elem"]),
        hbm_efficiency=float(d["hbm_efficiency"]),
        compute_efficiency=float(d["compute_efficiency"]),
        calibration_achievable_flops=hardware(str(d["calibrated_on"])).achievable_flops,
        defaults=dict(d["defaults"]),
        kv_transfer_overlap=bool(d["kv_transfer"]["overlap"]),
        kv_transfer_latency_s=float(d["kv_transfer"]["latency_ms"]) / 1e3,
        kv_transfer_efficiency=float(d["kv_transfer"]["efficiency"]),
        memory_defaults=_memory_defaults(entry.name, d.get("defaults_by_memory") or [],
                                         set(d["defaults"])),
    )


def _memory_defaults(name: str, tiers: object, known: set[str]
                     ) -> tuple[tuple[float, dict[str, Any]], ...]:
    where = f"framework {name}: simulator.defaults_by_memory"
    if not isinstance(tiers, list):
        raise CatalogError(f"{where} is a list of {{min_gib: G, argument: value}}")
    out = []
    for tier in tiers:
        if not isinstance(tier, dict) or "min_gib" not in tier or len(tier) < 2:
            raise CatalogError(f"{where}: {tier!r} is not {{min_gib: G, argument: value}}")
        overrides = {k: v for k, v in tier.items() if k != "min_gib"}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise CatalogError(f"{where}: {unknown} are not among `defaults` ({sorted(known)})")
        out.append((float(tier["min_gib"]), overrides))
    return tuple(out)


def mtp_acceptance_length(architecture_name: str, k: int) -> float | None:
    """AL of a native MTP head without a golden curve: 1 + p + ... + p^k (models.yaml
    `mtp_acceptance_rate`), or None when the catalog has no rate for the architecture."""
    rates = _load("models.yaml").get("mtp_acceptance_rate", {})
    if architecture_name not in rates:
        return None
    p = float(rates[architecture_name])
    return float(sum(p ** i for i in range(k + 1)))
