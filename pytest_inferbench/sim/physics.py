"""Step time from the roofline: weights and KV over HBM, FLOPs over tensor cores, all-reduces.

`StepCost` is built once per engine from the catalogs and the engine arguments; its methods
take per-step aggregates (plain floats or numpy arrays of many steps at once, so the fast
decode path prices a whole stretch of steps in one call). Equations: docs/simulator.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from .attention import kv_terms
from .catalog import (
    COMPUTE_DTYPE,
    DTYPE_BYTES,
    KV_DTYPE_BYTES,
    PARTS,
    Architecture,
    Checkpoint,
    Framework,
    Hardware,
)
from .efficiency import Efficiency, eager_overhead_s, profile_efficiency
from .pipeline import ACTIVATION_BYTES, Pipeline

if TYPE_CHECKING:
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]

# Steps up to which a stretch is priced one number at a time: numpy's fixed cost per operation
# makes a short stretch's arrays cost as much as this many steps priced as numbers (measured:
# 25-50 us for the arrays of 1 to 32 steps, 4-6 us a step as numbers; even at about 8).
SHORT_STRETCH = 8
LOGIT_BYTES = 4.0  # fp32 logits read by the sampler / rejection sampler
# Logits travel between TP ranks in the model dtype (bf16) before sampling.
LOGIT_GATHER_BYTES = 2.0
ACTIVATION_BUFFERS = 8  # live bf16 hidden-size buffers per batched token (profiled peak)


class EngineConfigError(ValueError):
    """The engine arguments cannot work (e.g. the weights do not fit); a clear message."""


def served_dtypes(ckpt: Checkpoint, hw: Hardware, online_quant: str | None) -> dict[str, str]:
    """Stored dtype of each part as served: online quantization, then hardware fallbacks."""
    dtypes = dict(ckpt.dtypes)
    if online_quant:
        for part in ("attention", "dense_ffn", "shared_experts"):
            if dtypes[part] == "bf16":
                dtypes[part] = online_quant
    return dtypes


def compute_dtype(stored: str, hw: Hardware) -> str:
    """The tensor-core dtype a stored weight dtype multiplies in on this chip.

    Without fp4 tensor cores (MI300X, MI325X, Hopper) 4-bit weights stay 4-bit in HBM and are
    dequantized in the GEMM (weight-only, W4A16: vLLM/SGLang Marlin and Triton MXFP4 kernels,
    which is how gpt-oss and DeepSeek-V4 run on Hopper), so they compute in bf16. Used for
    the dense GEMMs; the routed experts compute at the bf16 rate (`shard_model`)."""
    dtype = COMPUTE_DTYPE[stored]
    return dtype if hw.supports(dtype) else "bf16"


@dataclass(frozen=True)
class ModelOnGpus:
    """One model (target or draft) sharded over the TP group, as per-GPU coefficients."""

    base_bytes: float  # per-GPU bytes read every step regardless of routing
    expert_bytes: float  # per-GPU bytes of one routed expert of one layer
    moe_layers: int
    experts: int
    top_k: int
    resident_bytes: float  # per-GPU bytes held in HBM
    linear_s_per_token: float  # GEMM time per token at 100% of peak, lm_head excluded
    lm_head_s_per_token: float
    kv_a: float  # per-GPU KV bytes read per context token (full layers + indexer)
    kv_b: float  # per-GPU KV bytes read per windowed context token (sparse layers)
    attn_a_s: float  # attention time per (query, context token) pair, full layers + indexer
    attn_b_s: float  # same for the sparse layers' windowed context
    window: float  # sparse-attention window (inf when the model has none)
    kv_store_per_token: float  # per-GPU bytes one token occupies in the KV cache
    layers: int
    hidden: int
    vocab: int
    kv_seq: float = 0.0  # per-GPU bytes read per sequence per step (windows, recurrent state)
    attn_q_s: float = 0.0  # attention time per query token independent of context
    prefill_pair_scale: float = 1.0  # prefill pair cost / decode pair cost (MLA: < 1)
    kv_store_per_seq: float = 0.0  # per-GPU bytes each running sequence holds besides its KV
    expert_s_per_token: float = 0.0  # the routed experts' share of linear_s_per_token
    lm_head_bytes: float = 0.0  # the lm_head's share of base_bytes

    def weight_bytes_read(self, n_tok: FloatArray | float) -> FloatArray | float:
        """Per-GPU weight bytes a forward over n_tok tokens streams (uniform routing)."""
        if not self.experts:
            return self.base_bytes
        touched = self.experts * (1.0 - (1.0 - self.top_k / self.experts) ** n_tok)
        return self.base_bytes + self.moe_layers * touched * self.expert_bytes


def shard_model(ckpt: Checkpoint, hw: Hardware, *, tp: int, dp_attn: bool, kv_dtype: str,
                online_quant: str | None) -> ModelOnGpus:
    arch: Architecture = ckpt.architecture
    dtypes = served_dtypes(ckpt, hw, online_quant)
    params = arch.part_params()
    part_bytes = {p: params[p] * DTYPE_BYTES[dtypes[p]] for p in PARTS}
    # DP attention replicates the attention weights and splits sequences instead of heads.
    attn_shards = 1 if dp_attn else tp
    resident = sum(part_bytes.values()) / tp + part_bytes["attention"] * (1 / attn_shards - 1 / tp)
    base = (part_bytes["attention"] / attn_shards + (part_bytes["dense_ffn"]
            + part_bytes["shared_experts"] + part_bytes["router"] + part_bytes["lm_head"]) / tp)
    expert_bytes = arch.expert_params * DTYPE_BYTES[dtypes["experts"]] / tp if arch.experts else 0.0

    def gemm_s(part: str, active: float) -> float:
        return 2.0 * active / (tp * hw.peak_flops[compute_dtype(dtypes[part], hw)])

    linear = (gemm_s("attention", params["attention"]) + gemm_s("dense_ffn", params["dense_ffn"])
              + gemm_s("shared_experts", params["shared_experts"])
              + gemm_s("router", params["router"]))
    # The routed experts multiply at the bf16 rate whatever their dtype: a grouped GEMM sees
    # N x top_k / experts rows per expert (a few hundred in a prefill chunk, a handful in
    # decode), too few to reach an fp8 / fp4 tensor-core peak, and the MoE paths around it
    # (permute, quantize the activations, combine) do not speed up with the weights' dtype.
    # Their bytes stay their own (docs/simulator.md, "Step time").
    experts_s = (2.0 * arch.moe_layers * arch.top_k * arch.expert_params
                 / (tp * hw.peak_flops["bf16"]) if arch.experts else 0.0)
    linear += experts_s
    kv_b_per_elem = KV_DTYPE_BYTES.get(kv_dtype)
    if kv_b_per_elem is None:
        raise EngineConfigError(f"kv cache dtype {kv_dtype!r} unknown; "
                                f"known: {', '.join(KV_DTYPE_BYTES)}")
    kv = kv_terms(arch.attention, layers=arch.layers, tp=tp, dp_attn=dp_attn,
                  kv_bytes=kv_b_per_elem)
    bf16 = hw.peak_flops["bf16"]
    return ModelOnGpus(
        base_bytes=base, expert_bytes=expert_bytes, moe_layers=arch.moe_layers,
        experts=arch.experts, top_k=arch.top_k, resident_bytes=resident,
        linear_s_per_token=linear, lm_head_s_per_token=gemm_s("lm_head", params["lm_head"]),
        kv_a=kv.read_a, kv_b=kv.read_b,
        attn_a_s=kv.flops_a / bf16, attn_b_s=kv.flops_b / bf16,
        window=kv.window, kv_store_per_token=kv.store_token,
        layers=arch.layers, hidden=arch.hidden, vocab=arch.vocab,
        kv_seq=kv.read_seq, attn_q_s=kv.flops_q / bf16,
        prefill_pair_scale=kv.prefill_pair_scale, kv_store_per_seq=kv.store_seq,
        expert_s_per_token=experts_s, lm_head_bytes=part_bytes["lm_head"] / tp,
    )


def windowed_sum(c0: float, c1: float, window: float) -> tuple[float, float]:
    """(sum of c, sum of min(c, window)) for integer positions c in (c0, c1]."""
    full = (c1 * (c1 + 1) - c0 * (c0 + 1)) / 2.0
    if window >= c1:
        return full, full
    lo = min(c0, window)
    part = (window * (window + 1) - lo * (lo + 1)) / 2.0 if window > c0 else 0.0
    return full, part + (c1 - max(c0, window)) * window


def _longer(a: FloatArray | float, b: FloatArray | float) -> FloatArray | float:
    """The larger of two durations, elementwise where either is an array."""
    if isinstance(a, float) and isinstance(b, float):
        return a if a >= b else b
    longer: FloatArray = np.maximum(a, b)
    return longer


class PrefillTerms:
    """What a step's prefill chunks add to its price (`StepCost.step`'s prefill_* terms)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.tokens = self.seqs = self.ctx = self.ctx_win = self.pairs = self.win_pairs = 0.0

    def add(self, c0: float, n: int, completes: bool) -> None:
        """A chunk of `n` prompt tokens after `c0` computed ones (`completes`: its last)."""
        c1 = c0 + n
        self.tokens += n
        self.seqs += 1.0 if completes else 0.0
        self.ctx += c1
        self.ctx_win += min(c1, self.window)
        a, b = windowed_sum(c0, c1, self.window)
        self.pairs += a
        self.win_pairs += b


@dataclass(frozen=True)
class StepCost:
    target: ModelOnGpus
    draft: ModelOnGpus | None
    k: int  # speculative tokens (0 without speculative decoding)
    tp: int
    ep: bool
    overhead_s: float
    allreduce_latency_s: float  # one collective among the TP ranks (the hardware's)
    allreduce_bytes_per_elem: float
    link_bytes_per_s: float
    mem_bytes_per_s: float  # hbm_efficiency x peak bandwidth
    eta_flops: float
    # Attention kernels' achieved fraction of the bf16 peak: the chip's realizable fraction
    # (FlashAttention-3 reaches 740 of H100's 989 TFLOP/s, FlashMLA 580-660 of H800's 989),
    # not the profile's GEMM figure.
    attn_eta_flops: float
    dp_attn: bool = False  # attention data-parallel over the TP ranks
    pipeline: Pipeline | None = None  # pp stages of tp GPUs each; None: pp 1

    @classmethod
    def build(cls, *, target: ModelOnGpus, draft: ModelOnGpus | None, k: int, tp: int, ep: bool,
              hw: Hardware, fw: Framework, dp_attn: bool = False,
              efficiency: Efficiency | None = None, cuda_graphs: bool = True,
              pp: int = 1) -> StepCost:
        """`efficiency`: a calibration's knobs in place of the profile's (its step overhead
        is the measured server's, graphs or not, and is used as is); `cuda_graphs`: False when
        the server runs its forwards eagerly; `pp`: pipeline stages of `tp` GPUs each."""
        if efficiency is not None:
            eff, overhead = efficiency, efficiency.step_overhead_s
        else:
            eff = profile_efficiency(hw, fw, target.layers)
            overhead = eff.step_overhead_s + (0.0 if cuda_graphs
                                              else eager_overhead_s(target.layers))
        return cls(target=target, draft=draft, k=k, tp=tp, ep=ep, overhead_s=overhead,
                   allreduce_latency_s=hw.collective_latency_s(tp),
                   allreduce_bytes_per_elem=fw.allreduce_bytes_per_elem,
                   link_bytes_per_s=hw.link_bytes_per_s,
                   mem_bytes_per_s=eff.hbm_efficiency * hw.hbm_bytes_per_s,
                   eta_flops=eff.compute_efficiency, attn_eta_flops=hw.achievable_flops,
                   dp_attn=dp_attn,
                   pipeline=Pipeline.on(hw, tp=tp, pp=pp, hidden=target.hidden))

    def _comm(self, m: ModelOnGpus, n_tok: FloatArray | float,
              n_sampled: FloatArray | float = 0.0) -> FloatArray | float:
        fixed, per_token, per_sampled = self._comm_terms[id(m)]
        return fixed + per_token * n_tok + per_sampled * n_sampled

    @cached_property
    def _comm_terms(self) -> dict[int, tuple[float, float, float]]:
        """Communication of a forward of the target or the draft as fixed seconds, seconds
        per token and per sampled token (priced at every step: worked out once)."""
        return {id(m): self._comm_coefficients(m)
                for m in (self.target, self.draft) if m is not None}

    def _comm_coefficients(self, m: ModelOnGpus) -> tuple[float, float, float]:
        if self.tp == 1:
            return 0.0, 0.0, 0.0
        t = self.tp
        bytes_per_token = m.hidden * self.allreduce_bytes_per_elem
        volume = 2.0 * (t - 1) / t * bytes_per_token / self.link_bytes_per_s
        if self.dp_attn and self.ep and m.moe_layers:
            # DP attention with expert parallelism (wide-EP serving, DeepEP-style): each rank
            # attends its own sequences (no all-reduce after attention), and each MoE layer
            # dispatches the hidden states of the rank's own N/T tokens to their top_k experts'
            # ranks and combines them back, the (T-1)/T of copies that leave the rank; the
            # dense layers gather and scatter their tokens like one all-reduce. Each rank
            # samples its own sequences: no logits gather.
            dense = m.layers - m.moe_layers
            a2a = 2.0 * m.top_k * (t - 1) / t * bytes_per_token / t / self.link_bytes_per_s
            return ((2 * m.moe_layers + dense) * self.allreduce_latency_s,
                    m.moe_layers * a2a + dense * volume, 0.0)
        # Per layer: one all-reduce after attention, one after the FFN; under EP the MoE
        # layers' all-reduce becomes a dispatch and a combine all-to-all of top_k copies.
        collectives = 2 * m.layers + (m.moe_layers if self.ep else 0)
        per_token = 2 * m.layers * volume
        if self.ep:
            per_token += m.moe_layers * (m.top_k - 1) * volume
        # The vocabulary-parallel lm_head's logits are gathered (bf16) before sampling.
        gather = (t - 1) / t * m.vocab * LOGIT_GATHER_BYTES / self.link_bytes_per_s
        return collectives * self.allreduce_latency_s, per_token, gather

    def forward(self, m: ModelOnGpus, n_tok: FloatArray | float, n_sampled: FloatArray | float,
                ctx_sum: FloatArray | float, ctx_win_sum: FloatArray | float,
                attn_pairs: FloatArray | float, attn_win_pairs: FloatArray | float,
                n_seqs: FloatArray | float = 0.0) -> FloatArray | float:
        """One forward pass of `m` (no fixed overhead), as a sum over its kernels.

        The kernels run one after another, so each takes the longer of its own HBM time and
        its own compute time (a roofline per kernel, as LLM-Viewer and GenZ price a layer);
        one kernel's FLOPs cannot hide under another's bytes. Kernels of the same kind are
        grouped: the dense GEMMs (attention projections, dense and shared FFNs, router), the
        routed experts, attention over the KV cache, the lm_head. Then the sampler, which
        reads the whole vocabulary's logits on the rank that samples, and communication.
        """
        bw, eta = self.mem_bytes_per_s, self.eta_flops
        dense_bytes = m.base_bytes - m.lm_head_bytes
        dense_s = m.linear_s_per_token - m.expert_s_per_token
        kv_bytes = m.kv_a * ctx_sum + m.kv_b * ctx_win_sum + m.kv_seq * n_seqs
        attn_cmp = n_tok * m.attn_q_s + m.attn_a_s * attn_pairs + m.attn_b_s * attn_win_pairs
        # One expression for numbers and arrays alike: a stretch's steps share their token
        # counts and differ only in context, so only the attention term is an array there,
        # and a step priced alone gives exactly what it gives priced in a stretch.
        t = (_longer(dense_bytes / bw, n_tok * dense_s / eta)
             + _longer(m.lm_head_bytes / bw, n_sampled * m.lm_head_s_per_token / eta)
             + _longer(kv_bytes / bw, attn_cmp / self.attn_eta_flops))
        if m.experts:
            t = t + _longer(m.weight_bytes_read(n_tok) - m.base_bytes,
                            n_tok * m.expert_s_per_token * bw / eta) / bw
        return t + n_sampled * m.vocab * LOGIT_BYTES / bw + self._comm(m, n_tok, n_sampled)

    def step_with(self, decode_seqs: float, decode_ctx: float, decode_ctx_win: float,
                  chunks: PrefillTerms) -> float:
        """Duration of one step of these decode sums and prefill chunks."""
        return float(self.step(
            decode_seqs=decode_seqs, decode_ctx=decode_ctx, decode_ctx_win=decode_ctx_win,
            prefill_tokens=chunks.tokens, prefill_seqs=chunks.seqs, prefill_ctx=chunks.ctx,
            prefill_ctx_win=chunks.ctx_win, prefill_pairs=chunks.pairs,
            prefill_win_pairs=chunks.win_pairs))

    def stretch(self, decode_seqs: float, decode_ctx: FloatArray, decode_ctx_win: FloatArray
                ) -> FloatArray:
        """Durations of a stretch of decode steps of the same sequences (their context sums
        per step): numbers one step at a time for a few steps, where an array's every
        operation costs more than the arithmetic, arrays for more; the same values."""
        if len(decode_ctx) > SHORT_STRETCH:
            return np.asarray(self.step(decode_seqs=decode_seqs, decode_ctx=decode_ctx,
                                        decode_ctx_win=decode_ctx_win), dtype=np.float64)
        return np.array([self.step(decode_seqs=decode_seqs, decode_ctx=c, decode_ctx_win=w)
                         for c, w in zip(decode_ctx.tolist(), decode_ctx_win.tolist(),
                                         strict=True)], dtype=np.float64)

    def step(self, *, decode_seqs: FloatArray | float, decode_ctx: FloatArray | float,
             decode_ctx_win: FloatArray | float,
             prefill_tokens: FloatArray | float = 0.0, prefill_seqs: FloatArray | float = 0.0,
             prefill_ctx: FloatArray | float = 0.0, prefill_ctx_win: FloatArray | float = 0.0,
             prefill_pairs: FloatArray | float = 0.0,
             prefill_win_pairs: FloatArray | float = 0.0) -> FloatArray | float:
        """Duration of one engine step (a pipelined worker's: `pipeline.Pipeline.step`).

        Arguments as `_pass`'s."""
        terms = (decode_seqs, decode_ctx, decode_ctx_win, prefill_tokens, prefill_seqs,
                 prefill_ctx, prefill_ctx_win, prefill_pairs, prefill_win_pairs)
        if self.pipeline is None:
            return self._pass(*terms)
        return self.pipeline.step(self._pass, self.k, terms)

    def _pass(self, decode_seqs: FloatArray | float, decode_ctx: FloatArray | float,
              decode_ctx_win: FloatArray | float, prefill_tokens: FloatArray | float,
              prefill_seqs: FloatArray | float, prefill_ctx: FloatArray | float,
              prefill_ctx_win: FloatArray | float, prefill_pairs: FloatArray | float,
              prefill_win_pairs: FloatArray | float) -> FloatArray | float:
        """One forward pass over the whole model on the tp GPUs, with its overhead.

        decode_ctx / decode_ctx_win: sums over decode sequences of c and min(c, window);
        prefill_ctx*: the same for the prefill chunks' final context; prefill_*pairs: their
        (query, key) pairs. Under speculative decoding every decode sequence verifies k+1
        tokens (all of them computed, the rejected ones wasted) and the draft runs k chained
        forwards.
        """
        q = self.k + 1
        n_tok = decode_seqs * q + prefill_tokens
        m = self.target
        scale = m.prefill_pair_scale
        t = self.overhead_s + self.forward(
            m, n_tok, decode_seqs * q + prefill_seqs,
            decode_ctx + prefill_ctx, decode_ctx_win + prefill_ctx_win,
            decode_ctx * q + prefill_pairs * scale, decode_ctx_win * q + prefill_win_pairs * scale,
            decode_seqs + prefill_seqs)
        if self.draft is not None and self.k:
            d = self.draft
            dscale = d.prefill_pair_scale
            # Each draft forward pays the launch overhead of its share of layers.
            per_draft = self.overhead_s * d.layers / self.target.layers
            # vLLM's EAGLE proposer (ATOM's follows it): the first draft forward runs over
            # every token the target just ran -- the k+1 verified positions of each decoding
            # sequence (the padded drafter batch) and the prefill tokens, which builds the
            # draft's own KV -- and samples one draft per sequence; the other k-1 forwards
            # run over one token per sequence.
            first = self.forward(
                d, decode_seqs * q + prefill_tokens, decode_seqs + prefill_seqs,
                decode_ctx + prefill_ctx, decode_ctx_win + prefill_ctx_win,
                decode_ctx * q + prefill_pairs * dscale,
                decode_ctx_win * q + prefill_win_pairs * dscale, decode_seqs + prefill_seqs)
            t = t + self.k * per_draft + first
            if self.k > 1:
                t = t + (self.k - 1) * self.forward(
                    d, decode_seqs, decode_seqs, decode_ctx, decode_ctx_win, decode_ctx,
                    decode_ctx_win, decode_seqs)
        return t


def kv_capacity_tokens(*, hw: Hardware, models: list[ModelOnGpus], gpu_memory_utilization: float,
                       max_num_batched_tokens: int, max_num_seqs: int = 0,
                       free_fraction: float | None = None, pp: int = 1) -> int:
    """Tokens the KV cache holds: HBM x utilization - weights - activations - per-sequence
    state (sliding windows, recurrent state, reserved for max_num_seqs), per GPU.

    `models` are sharded over the tp GPUs of one stage; with `pp` stages each GPU holds 1/pp
    of the layers' weights and of every token's KV, so a worker holds pp times the tokens
    its HBM left after the weights would give one stage holding all the layers."""
    target = models[0]
    budget = hw.hbm_bytes * (gpu_memory_utilization if free_fraction is None else 1.0)
    weights = sum(m.resident_bytes for m in models) / pp
    activations = ACTIVATION_BUFFERS * ACTIVATION_BYTES * target.hidden * max_num_batched_tokens
    free = (budget - weights - activations
            - max_num_seqs * sum(m.kv_store_per_seq for m in models) / pp)
    if free <= 0:
        raise EngineConfigError(
            f"the weights do not fit: {weights / 1e9:.1f} GB per GPU of weights plus "
            f"{activations / 1e9:.1f} GB activations exceed {budget / 1e9:.1f} GB "
            f"({hw.name} {hw.hbm_bytes / 1e9:.0f} GB x gpu_memory_utilization "
            f"{gpu_memory_utilization}); use more tensor or pipeline parallelism")
    if free_fraction is not None:
        free *= free_fraction
    per_token = sum(m.kv_store_per_token for m in models) / pp
    return int(free // per_token)


__all__ = ["EngineConfigError", "ModelOnGpus", "PrefillTerms", "StepCost",
           "kv_capacity_tokens", "served_dtypes", "shard_model", "windowed_sum"]
