"""Decode inventory: a model reduced to the byte, FLOP and traffic figures one decode step needs.

This is the common currency between model readers (an HF ``config.json`` through
:mod:`optimizer.model`, or an inventory file such as the DeepSeek-V4.1-Flash one) and the
problems that size deployments on them (supernode sizing, serving). Every figure is for the
whole model (all layers), in bytes or FLOP; per-card figures come from a layout.

Linear figures are ``fixed + per_context_token * context`` (reference chapter, section 6.7.4).
"""
from __future__ import annotations

from dataclasses import dataclass, field


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
