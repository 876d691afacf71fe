"""Attention per family: its weights, the KV (or state) it keeps and reads, and its FLOPs.

Every family reduces to the same per-GPU coefficients, so the step-time equations stay one set
(`physics.StepCost`) for all of them:

- bytes per context token kept (`store_token`) and kept per sequence whatever its length
  (`store_seq`: sliding windows, recurrent state);
- bytes read per decode step per context token (`read_a`), per token of a capped context
  min(c, `window`) (`read_b`), per sequence (`read_seq`);
- FLOPs per (query, context token) pair (`flops_a`), per (query, capped-context token) pair
  (`flops_b`), per query token (`flops_q`); `prefill_pair_scale` is the prefill pair cost relative
  to decode (MLA decodes with absorbed weights over the latent, prefills in multi-head form).

Families (sources in `catalog/models.yaml`):
- GQA: K and V per KV head, heads split over TP (a KV head shared by ranks is replicated);
- MLA (DeepSeek-V3/R1, Kimi-K2.5): one latent of kv_lora + rope elements per token and layer,
  replicated on every TP rank (the heads are split, the latent is not);
- DSA (GLM-5): MLA plus an indexer key per token; attention reads the top `index_topk` tokens;
- MSA (MiniMax-M3): sparse layers read at most `window_tokens`, an indexer reads every token;
- compressed attention (DeepSeek-V4): one 512-wide KV entry per `ratio` tokens (CSA ratio 4 with
  an indexer picking the top `index_topk` entries, HCA ratio 128 read whole) plus a sliding
  window of raw tokens in every layer;
- sliding window (gpt-oss): windowed layers keep only the last `window` tokens;
- linear attention (Qwen3.5 Gated DeltaNet): a fixed state per sequence, read and written every
  step, no growth with context.
Under DP attention each rank holds and reads only its own sequences: per-token terms are /TP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Indexer keys are fp8 with a scale per key (DeepSeek-V3.2 / GLM-5 DSA, MiniMax-M3 MSA).
INDEX_KEY_BYTES = 1.0
# Recurrent state of linear attention is kept in the model dtype (bf16). Assumption: SGLang
# can keep it in fp32 (`--mamba-ssm-dtype`), which would double these bytes.
STATE_BYTES = 2.0
# Gated DeltaNet FLOPs per value-head state element per token: decay, delta-rule read (S k),
# rank-1 update (k v^T) and output (S q), ~2 FLOPs each. Assumption from the recurrence.
GDN_FLOPS_PER_STATE_ELEM = 8.0


@dataclass(frozen=True)
class AttentionShape:
    """What the catalog says about a model's attention: its heads and each family's numbers."""

    kind: str  # gqa | mla | compressed
    heads: int
    kv_heads: int
    head_dim: int
    mla: dict[str, int] | None = None
    sparse: dict[str, int] | None = None  # MSA: full_layers, window_tokens, indexer_*
    dsa: dict[str, int] | None = None  # index_topk, indexer_heads, indexer_dim
    sliding: dict[str, int] | None = None  # layers, window
    linear: dict[str, int] | None = None  # layers, key_heads, value_heads, key_dim, value_dim
    compressed: dict[str, int] | None = None  # DeepSeek-V4, see module doc
    output_gate: bool = False  # Qwen3.5 gated attention: a second q-sized projection

    @classmethod
    def from_catalog(cls, d: dict[str, Any]) -> AttentionShape:
        def ints(key: str) -> dict[str, int] | None:
            v = d.get(key)
            return {k: int(x) for k, x in v.items()} if v else None
        kind = "mla" if d.get("mla") else "compressed" if d.get("compressed_attention") else "gqa"
        return cls(kind=kind, heads=int(d["heads"]), kv_heads=int(d["kv_heads"]),
                   head_dim=int(d["head_dim"]), mla=ints("mla"),
                   sparse=ints("sparse_attention"), dsa=ints("dsa"),
                   sliding=ints("sliding_window"), linear=ints("linear_attention"),
                   compressed=ints("compressed_attention"),
                   output_gate=bool(d.get("attn_output_gate", False)))

    @property
    def kv_elems_per_token_layer(self) -> int:
        """K and V elements one token stores in one layer, over all KV heads."""
        return 2 * self.kv_heads * self.head_dim


@dataclass(frozen=True)
class KVTerms:
    store_token: float
    store_seq: float
    read_a: float
    read_b: float
    read_seq: float
    flops_a: float
    flops_b: float
    flops_q: float
    prefill_pair_scale: float
    window: float


def attention_params(s: AttentionShape, *, layers: int, hidden: int) -> int:
    """Parameters of every attention block (projections only) of a model with `layers`
    decoder layers of width `hidden`."""
    h = hidden
    linear_layers = s.linear["layers"] if s.linear else 0
    softmax_layers = layers - linear_layers
    if s.kind == "mla" and s.mla:
        m = s.mla
        qk = m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
        q = (h * m["q_lora_rank"] + m["q_lora_rank"] * s.heads * qk if m["q_lora_rank"]
             else h * s.heads * qk)
        kv = h * (m["kv_lora_rank"] + m["qk_rope_head_dim"]) + m["kv_lora_rank"] * s.heads * (
            m["qk_nope_head_dim"] + m["v_head_dim"])
        per_layer = q + kv + s.heads * m["v_head_dim"] * h
        if s.dsa:
            per_layer += h * s.dsa["indexer_heads"] + h * s.dsa["indexer_dim"] + (
                s.mla["q_lora_rank"] * s.dsa["indexer_heads"] * s.dsa["indexer_dim"])
    elif s.kind == "compressed" and s.compressed:
        c, d = s.compressed, s.head_dim
        q = h * c["q_lora_rank"] + c["q_lora_rank"] * s.heads * d
        kv = h * d
        # Grouped low-rank output: heads*d -> o_groups x o_lora_rank -> hidden.
        out = s.heads * d * c["o_lora_rank"] + c["o_groups"] * c["o_lora_rank"] * h
        per_layer = q + kv + out
        csa = c["csa_layers"]
        indexer = h * c["indexer_heads"] + c["q_lora_rank"] * c["indexer_heads"] * c[
            "indexer_dim"] + h * c["indexer_dim"]
        return layers * per_layer + csa * indexer
    else:
        q = h * s.heads * s.head_dim * (2 if s.output_gate else 1)
        per_layer = q + 2 * h * s.kv_heads * s.head_dim + s.heads * s.head_dim * h
    total = softmax_layers * per_layer
    if s.linear:
        lin = s.linear
        k_dim = lin["key_heads"] * lin["key_dim"]
        v_dim = lin["value_heads"] * lin["value_dim"]
        # q, k, v, z (output gate) and the per-head beta / decay projections; out projection.
        total += linear_layers * (h * (2 * k_dim + 2 * v_dim) + h * 2 * lin["value_heads"]
                                  + v_dim * h)
    return total


def kv_terms(s: AttentionShape, *, layers: int, tp: int, dp_attn: bool,
             kv_bytes: float) -> KVTerms:
    """Per-GPU KV / state coefficients of a model with `layers` decoder layers on a TP group
    (see the module doc)."""
    shard = 1.0 / tp if dp_attn else 1.0  # per-sequence state under DP attention
    linear_layers = s.linear["layers"] if s.linear else 0
    softmax_layers = layers - linear_layers
    store_token = store_seq = read_a = read_b = read_seq = 0.0
    flops_a = flops_b = flops_q = 0.0
    window = math.inf
    scale = 1.0
    if s.kind == "mla" and s.mla:
        m = s.mla
        latent = (m["kv_lora_rank"] + m["qk_rope_head_dim"]) * kv_bytes * shard  # replicated
        heads = s.heads / tp
        decode_pair = heads * (2 * (m["kv_lora_rank"] + m["qk_rope_head_dim"])
                               + 2 * m["kv_lora_rank"])
        prefill_pair = heads * (2 * (m["qk_nope_head_dim"] + m["qk_rope_head_dim"])
                                + 2 * m["v_head_dim"])
        scale = prefill_pair / decode_pair
        if s.dsa:
            window = float(s.dsa["index_topk"])
            index = layers * s.dsa["indexer_dim"] * INDEX_KEY_BYTES * shard
            store_token = layers * latent + index
            read_a = index
            read_b = layers * latent
            flops_a = layers * 2.0 * s.dsa["indexer_heads"] * s.dsa["indexer_dim"]
            flops_b = layers * decode_pair
        else:
            store_token = read_a = layers * latent
            flops_a = layers * decode_pair
    elif s.kind == "compressed" and s.compressed:
        c = s.compressed
        entry = s.head_dim * kv_bytes * shard  # one 512-wide KV head, replicated over TP
        pair = 4.0 * s.heads / tp * s.head_dim
        csa, hca, ratio_c, ratio_h = (c["csa_layers"], c["hca_layers"], c["csa_ratio"],
                                      c["hca_ratio"])
        index = c["indexer_dim"] * INDEX_KEY_BYTES * shard
        store_token = csa * (entry + index) / ratio_c + hca * entry / ratio_h
        store_seq = read_seq = layers * c["window"] * entry
        read_a = csa * index / ratio_c + hca * entry / ratio_h
        # CSA reads the top index_topk compressed entries: min(c / ratio, topk) entries.
        window = float(c["index_topk"] * ratio_c)
        read_b = csa * entry / ratio_c
        flops_a = (csa * 2.0 * c["indexer_heads"] * c["indexer_dim"] / ratio_c
                   + hca * pair / ratio_h)
        flops_b = csa * pair / ratio_c
        flops_q = layers * c["window"] * pair
    else:
        kv_heads_gpu = s.kv_heads / tp if dp_attn else math.ceil(s.kv_heads / tp)
        per_layer = 2 * kv_heads_gpu * s.head_dim * kv_bytes
        pair = 4.0 * s.heads * s.head_dim / tp
        full = softmax_layers
        if s.sparse:
            sp = s.sparse
            sparse_layers = softmax_layers - sp["full_layers"]
            full = sp["full_layers"]
            index_layers = sparse_layers / sp["index_topk_freq"]
            index = index_layers * sp["indexer_dim"] * kv_bytes
            window = float(sp["window_tokens"])
            store_token = softmax_layers * per_layer + index
            read_a = full * per_layer + index
            read_b = sparse_layers * per_layer
            flops_a = full * pair + 2.0 * index_layers * sp["indexer_heads"] * sp["indexer_dim"]
            flops_b = sparse_layers * pair
        elif s.sliding:
            windowed = s.sliding["layers"]
            full = softmax_layers - windowed
            window = float(s.sliding["window"])
            store_token = full * per_layer
            store_seq = windowed * per_layer * window
            read_a = full * per_layer
            read_b = windowed * per_layer
            flops_a = full * pair
            flops_b = windowed * pair
        else:
            store_token = read_a = full * per_layer
            flops_a = full * pair
    if s.linear:
        lin = s.linear
        state = lin["value_heads"] * lin["key_dim"] * lin["value_dim"]
        conv = (2 * lin["key_heads"] * lin["key_dim"] + lin["value_heads"] * lin["value_dim"]) * (
            lin.get("conv_kernel", 4) - 1)
        per_seq = linear_layers * (state + conv) * STATE_BYTES / tp
        store_seq += per_seq
        read_seq += 2.0 * per_seq  # read and written back every step
        flops_q += linear_layers * GDN_FLOPS_PER_STATE_ELEM * state / tp
    return KVTerms(store_token=store_token, store_seq=store_seq, read_a=read_a, read_b=read_b,
                   read_seq=read_seq, flops_a=flops_a, flops_b=flops_b, flops_q=flops_q,
                   prefill_pair_scale=scale, window=window)
