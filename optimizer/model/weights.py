"""Weight, KV-cache and state inventory of a :class:`~optimizer.model.config.ModelSpec`.

Counts are parameters per layer, grouped by how a layout shards them (reference chapter
eq. 6-1 terms):

* ``attn_split``: attention matrices split over attention TP (Q, O; MLA ``q_b``/``kv_b``/``o``
  or ``q_proj``; the Gated DeltaNet projections, convolution and per-head gates of linear layers);
* ``attn_kv``: the K and V projections of GQA layers, split over ``min(TP, KVH)`` GPUs (a GPU
  beyond KVH still holds a whole KV head's projection);
* ``attn_repl``: replicated attention matrices (MLA ``q_a`` and ``kv_a``, replicated in vLLM);
* ``dense_ffn``: SwiGLU ``3·H·F`` of dense layers; ``shared``: shared experts (and their gate);
  both split over attention TP;
* ``routed``: all routed experts of the layer (``E·3·H·F_e``), split over experts TP x EP;
* ``router``: ``E·H`` (plus DeepSeek's per-expert bias), replicated;
* ``norms``: RMSNorm weights, replicated.

Matrices are stored at the weight dtype; norms and routers stay 16-bit (``NORM_BYTES``) as in
quantised checkpoints (DeepSeek-V3 FP8 keeps the gate in BF16).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from optimizer.model.config import ModelSpec

NORM_BYTES = 2.0  # norm and router weights stay in 16 bits even in quantised checkpoints
ACTIVATION_BYTES = 2.0  # hidden vectors (and convolution states) are bf16
CATEGORIES = ("attn_split", "attn_kv", "attn_repl", "linear_attn", "dense_ffn", "shared", "routed", "router", "norms")


@dataclass(frozen=True)
class Weights:
    """Per-layer parameter counts (arrays of shape [L]) and bytes of one model at one dtype.

    Attributes:
        spec: the model.
        weight_bytes: bytes per matrix parameter (2 for bf16, 1 for fp8).
        kv_bytes: bytes per KV-cache element.
        per_layer: category -> parameters per layer, shape [L] (see module docstring).
        embedding: V·H parameters (0 when tied to the LM head, which then holds them).
        lm_head: V·H parameters.
        final_norm: H parameters.
        expert_params: parameters of one routed expert (``3·H·F_e``), 0 for a dense model.
    """

    spec: ModelSpec
    weight_bytes: float
    kv_bytes: float
    per_layer: dict
    embedding: float
    lm_head: float
    final_norm: float
    expert_params: float

    # ------------------------------------------------------------------ bytes
    def category_bytes(self, name: str) -> np.ndarray:
        """Bytes per layer of one category, shape [L]."""
        b = NORM_BYTES if name in ("router", "norms") else self.weight_bytes
        return self.per_layer[name] * b

    @property
    def expert_bytes(self) -> float:
        """Bytes of one routed expert of one layer."""
        return self.expert_params * self.weight_bytes

    @cached_property
    def kv_bytes_per_token_layer(self) -> np.ndarray:
        """KV-cache bytes per token per layer, shape [L]: GQA ``2·KVH·D·b``; MLA
        ``(kv_lora_rank + qk_rope_head_dim)·b`` (DeepSeek-V2 paper, eq. 9-10: only the latent and the
        RoPE key are cached); 0 for linear-attention layers."""
        m = self.spec
        per = (m.mla.kv_lora_rank + m.mla.qk_rope_head_dim) if m.mla else 2 * m.kv_heads * m.head_dim
        out = np.full(m.layers, per * self.kv_bytes)
        out[list(m.linear_layers)] = 0.0
        return out

    @cached_property
    def state_bytes_per_layer(self) -> np.ndarray:
        """Fixed bytes per session per layer, shape [L]: the Gated DeltaNet recurrent state
        ``nv·dk·dv`` at ``mamba_ssm_dtype`` plus the convolution state ``conv_dim·(kernel-1)`` in bf16;
        0 for full-attention layers."""
        m = self.spec
        out = np.zeros(m.layers)
        if m.linear:
            la = m.linear
            out[list(m.linear_layers)] = (la.v_heads * la.k_dim * la.v_dim * la.state_bytes
                                          + la.conv_dim * (la.conv_kernel - 1) * ACTIVATION_BYTES)
        return out

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes per context token for the whole model."""
        return float(self.kv_bytes_per_token_layer.sum())

    @property
    def state_bytes_per_session(self) -> float:
        """Fixed (context-independent) state bytes per session for the whole model."""
        return float(self.state_bytes_per_layer.sum())

    @cached_property
    def attention_flops_per_context_token_layer(self) -> np.ndarray:
        """Attention FLOP per decode token per context token per layer, shape [L]: GQA
        ``4·QH·D`` (QK^T and AV, eq. 6-5); MLA in its absorbed decode form
        ``QH·(4·kv_lora_rank + 2·qk_rope_head_dim)``; 0 for linear layers."""
        m = self.spec
        per = m.q_heads * (4 * m.mla.kv_lora_rank + 2 * m.mla.qk_rope_head_dim) if m.mla else 4 * m.q_heads * m.head_dim
        out = np.full(m.layers, float(per))
        out[list(m.linear_layers)] = 0.0
        return out

    @cached_property
    def state_flops_per_token_layer(self) -> np.ndarray:
        """Fixed FLOP per decode token per layer of the linear-attention recurrence, shape [L]:
        ``6·nv·dk·dv`` (delta-rule read, rank-1 update and output, Gated DeltaNet paper, eq. 8)."""
        m = self.spec
        out = np.zeros(m.layers)
        if m.linear:
            out[list(m.linear_layers)] = 6.0 * m.linear.v_heads * m.linear.k_dim * m.linear.v_dim
        return out

    # ------------------------------------------------------------------ totals
    def component_params(self) -> dict[str, float]:
        """Parameters per component: embedding, attention, linear_attention, dense_ffn,
        routed_experts, shared_experts, router, norms, lm_head."""
        p = self.per_layer
        return {
            "embedding": self.embedding,
            "attention": float((p["attn_split"] + p["attn_kv"] + p["attn_repl"]).sum()),
            "linear_attention": float(p["linear_attn"].sum()),
            "dense_ffn": float(p["dense_ffn"].sum()),
            "routed_experts": float(p["routed"].sum()),
            "shared_experts": float(p["shared"].sum()),
            "router": float(p["router"].sum()),
            "norms": float(p["norms"].sum()) + self.final_norm,
            "lm_head": self.lm_head,
        }

    def component_bytes(self) -> dict[str, float]:
        """Bytes per component (norms and router at ``NORM_BYTES``)."""
        return {k: v * (NORM_BYTES if k in ("router", "norms") else self.weight_bytes)
                for k, v in self.component_params().items()}

    @property
    def params(self) -> float:
        """Total parameters (tied embeddings counted once)."""
        return sum(self.component_params().values())

    @property
    def total_bytes(self) -> float:
        """Bytes of all weights."""
        return sum(self.component_bytes().values())

    @property
    def active_params_per_token(self) -> float:
        """Parameters one token uses: everything except the routed experts it does not visit
        (``k/E`` of the routed experts), embedding included (the usual "A22B" convention)."""
        routed = float(self.per_layer["routed"].sum())
        frac = self.spec.moe.experts_per_token / self.spec.moe.experts if self.spec.moe else 0.0
        return self.params - routed + routed * frac

    def as_dict(self) -> dict:
        """JSON-ready summary: params, weight_bytes, active_params_per_token, kv_bytes_per_token,
        state_bytes_per_session, max_context and ``components: {name: {params, bytes}}``."""
        cp, cb = self.component_params(), self.component_bytes()
        m = self.spec
        return {
            "name": m.name,
            "kind": m.kind,
            "layers": m.layers,
            "moe_layers": len(m.moe_layers),
            "linear_attention_layers": len(m.linear_layers),
            "params": self.params,
            "weight_bytes": self.total_bytes,
            "active_params_per_token": self.active_params_per_token,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "state_bytes_per_session": self.state_bytes_per_session,
            "max_context": m.max_context,
            "max_context_source": m.max_context_source,
            "tied_embeddings": m.tied_embeddings,
            "components": {k: {"params": cp[k], "bytes": cb[k]} for k in cp},
        }


def weights(spec: ModelSpec, weight_bytes: float, kv_bytes: float | None = None) -> Weights:
    """Weight inventory of ``spec`` with matrices at ``weight_bytes`` per parameter.

    Args:
        spec: the model.
        weight_bytes: bytes per matrix parameter (bf16: 2, fp8: 1).
        kv_bytes: bytes per KV element (default: ``weight_bytes``).
    Formulas (parameters per layer; H hidden, QH/KVH heads, D head dim):
        GQA attention: Q ``H·QH·D`` (x2 with an output gate), O ``QH·D·H``, K and V ``H·KVH·D`` each.
        MLA: ``q_a H·r_q`` and ``q_b r_q·QH·(d_nope+d_rope)`` (or ``q_proj H·QH·(d_nope+d_rope)``),
        ``kv_a H·(r_kv+d_rope)``, ``kv_b r_kv·QH·(d_nope+d_v)``, ``o QH·d_v·H``.
        Gated DeltaNet: ``in_proj_qkvz H·(2·nk·dk + 2·nv·dv)``, ``in_proj_ba H·2·nv``, conv
        ``(2·nk·dk + nv·dv)·kernel``, ``A_log``/``dt_bias`` ``nv`` each, ``out nv·dv·H``.
        SwiGLU FFN ``3·H·F``; MoE ``E·3·H·F_e`` routed, shared ``3·H·F_s`` (+ ``H`` gate), router ``E·H`` (+ ``E`` bias).
        Norms: 2 H-sized per layer, q/k norms ``2·D`` (Qwen3), MLA latent norms ``r_q + r_kv``,
        the DeltaNet gated norm ``dv``, and the final ``H``.
    """
    m = spec
    H, L = m.hidden, m.layers
    cat = {c: np.zeros(L) for c in CATEGORIES}
    linear = set(m.linear_layers)
    moe_layers = set(m.moe_layers)
    expert_params = 0.0
    for i in range(L):
        norms = 2 * H
        if i in linear:
            la = m.linear
            kd, vd = la.k_heads * la.k_dim, la.v_heads * la.v_dim
            cat["linear_attn"][i] = (H * (2 * kd + 2 * vd) + H * 2 * la.v_heads + la.conv_dim * la.conv_kernel
                                     + 2 * la.v_heads + vd * H)
            norms += la.v_dim
        elif m.mla:
            a = m.mla
            qk = a.qk_nope_head_dim + a.qk_rope_head_dim
            if a.q_lora_rank:
                cat["attn_repl"][i] += H * a.q_lora_rank
                cat["attn_split"][i] += a.q_lora_rank * m.q_heads * qk
                norms += a.q_lora_rank
            else:
                cat["attn_split"][i] += H * m.q_heads * qk
            cat["attn_repl"][i] += H * (a.kv_lora_rank + a.qk_rope_head_dim)
            cat["attn_split"][i] += a.kv_lora_rank * m.q_heads * (a.qk_nope_head_dim + a.v_head_dim)
            cat["attn_split"][i] += m.q_heads * a.v_head_dim * H
            norms += a.kv_lora_rank
        else:
            q = H * m.q_heads * m.head_dim * (2 if m.attn_output_gate else 1)
            cat["attn_split"][i] = q + m.q_heads * m.head_dim * H
            cat["attn_kv"][i] = 2 * H * m.kv_heads * m.head_dim
            if m.qk_norm:
                norms += 2 * m.head_dim
        if i in moe_layers:
            mo = m.moe
            expert_params = 3.0 * H * mo.expert_ffn
            cat["routed"][i] = mo.experts * expert_params
            cat["router"][i] = mo.experts * H + (mo.experts if mo.router_bias else 0)
            cat["shared"][i] = 3 * H * mo.shared_ffn + (H if mo.shared_gate and mo.shared_ffn else 0)
        else:
            cat["dense_ffn"][i] = 3 * H * m.ffn
        cat["norms"][i] = norms
    lm = float(m.vocab * H)
    return Weights(spec=m, weight_bytes=float(weight_bytes), kv_bytes=float(kv_bytes if kv_bytes is not None else weight_bytes),
                   per_layer=cat, embedding=0.0 if m.tied_embeddings else lm, lm_head=lm, final_norm=float(H),
                   expert_params=expert_params)
