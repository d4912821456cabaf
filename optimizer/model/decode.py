"""Decode inventory: a model reduced to the byte, FLOP and traffic figures one decode step needs.

This is the common currency between model readers (an HF ``config.json`` through
:mod:`optimizer.model`, or an inventory file such as the DeepSeek-V4.1-Flash one) and the
problems that size deployments on them (supernode sizing, serving). Every figure is for the
whole model (all layers), in bytes or FLOP; per-card figures come from a layout.

Linear figures are ``fixed + per_context_token * context`` (reference chapter, section 6.7.4).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from optimizer.errors import InputError
from optimizer.model.config import ModelSpec, read_hf_config
from optimizer.model.weights import weights


@dataclass(frozen=True)
class Linear:
    """``fixed + per_context_token * context`` (bytes or FLOP)."""

    fixed: float
    per_context_token: float

    def at(self, context: float) -> float:
        """Value at ``context`` tokens."""
        return self.fixed + self.per_context_token * context


@dataclass(frozen=True)
class LookupTable:
    """A read-only lookup table (e.g. an Engram n-gram table).

    Attributes:
        name: label used in placements and constraint keys.
        layer: the layer that consumes the looked-up rows (its prefetch window ends there).
        rows: number of rows.
        row_bytes: bytes per row.
        rows_per_token: rows looked up per token.
    """

    name: str
    layer: int
    rows: int
    row_bytes: int
    rows_per_token: float

    @property
    def bytes(self) -> float:
        return float(self.rows) * self.row_bytes


@dataclass(frozen=True)
class DecodeInventory:
    """What a decode step of one session needs, for the whole model.

    Attributes:
        name: model label.
        layers: Transformer blocks.
        moe_layers: blocks with routed experts (one dispatch and one combine All-to-All each).
        hidden: hidden size H.
        max_context: longest context the model accepts (tokens), or None when unknown.
        replicated_read_bytes: weights every card holds and reads every step (attention, shared
            experts, routers, LM head, dense FFN).
        replicated_resident_bytes: weights every card holds (the above plus e.g. the embedding).
        routed_experts: routed experts per MoE layer (0 for a dense model).
        experts_per_token: routed experts each token visits per MoE layer.
        expert_bytes: bytes of one routed expert of one layer.
        routed_bytes: bytes of all routed experts of all layers (sharded over the cards of an EP group).
        tables: read-only lookup tables (empty for most models).
        table_extra_bytes: bytes stored with the tables wherever they live (e.g. projections).
        kv_capacity_bytes: KV (and state) bytes one session holds, linear in its context.
        kv_read_bytes: KV bytes one decode step of one session reads, linear in its context.
        flops_per_token: FLOP of one decode token, linear in context.
        dispatch_bytes_per_token: bytes one token sends per MoE layer in the dispatch All-to-All
            (the combine sends the same back).
        source: where the figures come from (file and field).
    """

    name: str
    layers: int
    moe_layers: int
    hidden: int
    max_context: int | None
    replicated_read_bytes: float
    replicated_resident_bytes: float
    routed_experts: int
    experts_per_token: int
    expert_bytes: float
    routed_bytes: float
    kv_capacity_bytes: Linear
    kv_read_bytes: Linear
    flops_per_token: Linear
    dispatch_bytes_per_token: float
    tables: tuple[LookupTable, ...] = field(default_factory=tuple)
    table_extra_bytes: float = 0.0
    source: str = ""

    @property
    def table_bytes(self) -> float:
        return sum(t.bytes for t in self.tables)


DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5}
DEFAULT_KV_DTYPE = "bf16"
"""The KV-cache dtype of a checkpoint that declares no KV-cache quantization when ``kv_dtype`` is not
given, whatever the weights: the engines' ``auto`` (the model's activation dtype). Deployment and
serving read a quantized checkpoint's default from it and the engine
(:mod:`optimizer.model.checkpoint`, ``instances/engines/kv_defaults.yaml``); the supernode problem
takes this one."""


def decode_inventory(config, weight_dtype: str = "bf16", kv_dtype: str | None = None,
                     dispatch_bytes: float = 2.0, rope_scaling: dict | None = None) -> DecodeInventory:
    """The :class:`DecodeInventory` of a HuggingFace model.

    Args:
        config: path of a ``config.json`` or an :class:`optimizer.model.config.ModelSpec`.
        weight_dtype: matrix dtype (``bf16``, ``fp8``, ...; norms and routers stay 16-bit).
        kv_dtype: KV-cache dtype (default :data:`DEFAULT_KV_DTYPE`).
        dispatch_bytes: bytes per hidden element in the MoE dispatch (2: bf16; DeepEP's FP8
            dispatch is about 1).
        rope_scaling: override of the config's ``rope_scaling`` (sets ``max_context``).
    Returns:
        replicated_read_bytes: every non-routed weight read per step (attention, dense FFN, shared
        experts, routers, LM head; not the embedding, not the norms); replicated_resident_bytes:
        that plus the embedding and the norms, so that ``replicated_resident + routed`` is the
        weight total; kv_capacity ``state + kv_token·context``; kv_read ``2·state + kv_token·context``
        (the linear-attention state is read and written back); flops_per_token ``2·active params
        read + state FLOP + attention FLOP per context token`` (eqs. 6-4, 6-5).
    Raises:
        InputError: a bad config (see :func:`optimizer.model.config.parse_config`) or dtype.
    """
    kv_dtype = kv_dtype or DEFAULT_KV_DTYPE
    for name, d in (("weight_dtype", weight_dtype), ("kv_dtype", kv_dtype)):
        if d not in DTYPE_BYTES:
            raise InputError(None, name, f"unknown dtype {d!r} (one of {', '.join(DTYPE_BYTES)})")
    spec = config if isinstance(config, ModelSpec) else read_hf_config(Path(config), rope_scaling)
    w = weights(spec, DTYPE_BYTES[weight_dtype], DTYPE_BYTES[kv_dtype])
    cb = w.component_bytes()
    routed = cb["routed_experts"]
    resident = w.total_bytes - routed
    read = resident - cb["embedding"] - cb["norms"]
    moe = spec.moe
    k = moe.experts_per_token if moe else 0
    cp = w.component_params()
    active_params = (sum(cp[c] for c in ("attention", "linear_attention", "dense_ffn", "shared_experts", "router", "lm_head"))
                     + len(spec.moe_layers) * k * w.expert_params)
    return DecodeInventory(
        name=spec.name,
        layers=spec.layers,
        moe_layers=len(spec.moe_layers),
        hidden=spec.hidden,
        max_context=spec.max_context,
        replicated_read_bytes=read,
        replicated_resident_bytes=resident,
        routed_experts=moe.experts if moe else 0,
        experts_per_token=k,
        expert_bytes=w.expert_bytes,
        routed_bytes=routed,
        kv_capacity_bytes=Linear(w.state_bytes_per_session, w.kv_bytes_per_token),
        kv_read_bytes=Linear(2 * w.state_bytes_per_session, w.kv_bytes_per_token),
        flops_per_token=Linear(2 * active_params + float(w.state_flops_per_token_layer.sum()),
                               float(w.attention_flops_per_context_token_layer.sum())),
        dispatch_bytes_per_token=spec.hidden * dispatch_bytes if moe else 0.0,
        source=str(config) if not isinstance(config, ModelSpec) else spec.name,
    )
