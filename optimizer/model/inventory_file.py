"""Read a decode-inventory YAML file into a :class:`~optimizer.model.decode.DecodeInventory`.

An inventory file lists a model's bytes by component for models whose layout a generic
config reader cannot size (e.g. DeepSeek-V4.1-Flash with compressed attention and Engram
tables). Format (bytes are plain integers, linear figures are ``{fixed, per_context_token}``
meaning ``fixed + per_context_token x context_tokens``)::

    model: deepseek-ai/DeepSeek-V4.1-Flash
    layers: 40                       # Transformer blocks
    moe_layers: 40                   # optional, default: layers (blocks with routed experts)
    hidden_size: 5120
    max_position_embeddings: 1048576 # optional
    experts: {routed: 384, per_token: 6, expert_bytes: 18800640, routed_bytes: 288777830400}
    weights: {replicated_read_bytes: 8207877568, replicated_resident_bytes: 9531704768}
    engram:                          # optional: read-only lookup tables
      layers: [1, 14]                # consuming layer of each table
      rows: [384006168, 384016682]   # rows of each table
      row_bytes: 264                 # one number, or one per table
      rows_per_token: 48             # all tables together (split evenly), or one per table
      projection_bytes: 315043840    # stored with the tables wherever they live
    kv:
      capacity_bytes: {fixed: 2703360, per_context_token: 890}
      read_bytes_per_step: {fixed: 12763136, per_context_token: 170}
    flops_per_token: {fixed: 36019273952, per_context_token: 20480}
    dispatch_bytes_per_token: 61440  # per MoE layer, dispatch (combine sends the same back)

Validation is strict: a missing, negative or mistyped field, an unknown key, or inconsistent
totals (``engram.table_bytes`` when given must equal sum(rows) x row_bytes; ``routed_bytes``
when given must equal ``moe_layers x routed x expert_bytes``) raise one
:class:`~optimizer.errors.InputError` naming the file and the dotted field.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from optimizer.errors import InputError
from optimizer.model.config import CONFIG_INT_CAPS
from optimizer.model.decode import DecodeInventory, Linear, LookupTable
from optimizer.schema_base import read_yaml

_TOP = {"model", "layers", "moe_layers", "hidden_size", "vocab_size", "max_position_embeddings", "experts",
        "weights", "engram", "kv", "flops_per_token", "dispatch_bytes_per_token"}


class _Reader:
    def __init__(self, path: Path, data: dict[str, Any]):
        self.path = path
        self.data = data

    def fail(self, field: str, problem: str) -> InputError:
        return InputError(self.path, field, problem)

    def node(self, field: str, required: bool = True) -> Any:
        cur: Any = self.data
        for part in field.split("."):
            if not isinstance(cur, dict):
                raise self.fail(field, "expected a mapping above this field")
            if part not in cur:
                if required:
                    raise self.fail(field, "required field is missing")
                return None
            cur = cur[part]
        return cur

    def mapping(self, field: str, keys: set[str], required: bool = True) -> dict[str, Any] | None:
        v = self.node(field, required)
        if v is None and not required:
            return None
        if not isinstance(v, dict):
            raise self.fail(field, f"expected a mapping (got {v!r})")
        extra = sorted(set(v) - keys)
        if extra:
            raise self.fail(f"{field}.{extra[0]}", "unknown key")
        return v

    def number(self, field: str, *, integer: bool = False, positive: bool = False,
               required: bool = True, value: Any = None) -> float | int | None:
        v = self.node(field, required) if value is None else value
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.fail(field, f"expected a number (got {v!r})")
        if integer and (not isinstance(v, int) and not float(v).is_integer()):
            raise self.fail(field, f"expected a whole number (got {v!r})")
        if v < 0 or (positive and v == 0):
            raise self.fail(field, f"must be {'positive' if positive else 'non-negative'} (got {v!r})")
        return int(v) if integer else float(v)

    def linear(self, field: str) -> Linear:
        self.mapping(field, {"fixed", "per_context_token"})  # checks the keys
        return Linear(fixed=self.number(f"{field}.fixed"), per_context_token=self.number(f"{field}.per_context_token"))

    def per_table(self, field: str, n: int, *, integer: bool, split_total: bool) -> list[float]:
        """A list with one value per table, or one number (the same for each table, or, with
        ``split_total``, the total over all tables split evenly)."""
        v = self.node(field)
        if isinstance(v, list):
            if len(v) != n:
                raise self.fail(field, f"expected {n} values (one per table), got {len(v)}")
            return [self.number(f"{field}[{i}]", integer=integer, positive=True, value=x) for i, x in enumerate(v)]
        x = self.number(field, integer=integer, positive=True)
        return [x / n for _ in range(n)] if split_total else [x] * n


def read_inventory(path: str | Path) -> DecodeInventory:
    """Read and validate an inventory file.

    Args:
        path: the YAML file (format in the module docstring).
    Returns:
        The model's :class:`DecodeInventory` (whole-model bytes and FLOP, per session for KV).
    Raises:
        InputError: file missing or not YAML, a missing/mistyped/negative field, an unknown key,
            or inconsistent totals; the message names the file and the dotted field.
    """
    p = Path(path)
    r = _Reader(p, read_yaml(p))
    extra = sorted(set(r.data) - _TOP)
    if extra:
        raise r.fail(extra[0], "unknown key")
    name = r.node("model")
    if not isinstance(name, str) or not name:
        raise r.fail("model", "expected the model's name")
    layers = r.number("layers", integer=True, positive=True)
    if layers > CONFIG_INT_CAPS["num_hidden_layers"]:
        raise r.fail("layers", f"must be at most {CONFIG_INT_CAPS['num_hidden_layers']:,} (got {layers:,})")
    moe_layers = r.number("moe_layers", integer=True, required=False)
    moe_layers = layers if moe_layers is None else moe_layers
    if moe_layers > layers:
        raise r.fail("moe_layers", f"{moe_layers} exceeds layers ({layers})")
    hidden = r.number("hidden_size", integer=True, positive=True)
    max_ctx = r.number("max_position_embeddings", integer=True, positive=True, required=False)
    if "vocab_size" in r.data:
        r.number("vocab_size", integer=True, positive=True)

    r.mapping("experts", {"routed", "per_token", "shared", "moe_intermediate_size", "expert_bytes", "routed_bytes"})
    routed = r.number("experts.routed", integer=True)
    per_token = r.number("experts.per_token", integer=True)
    if per_token > routed:
        raise r.fail("experts.per_token", f"{per_token} exceeds experts.routed ({routed})")
    for opt in ("shared", "moe_intermediate_size"):
        r.number(f"experts.{opt}", integer=True, required=False)
    expert_bytes = r.number("experts.expert_bytes")
    routed_bytes = r.number("experts.routed_bytes", required=False)
    expected = moe_layers * routed * expert_bytes
    if routed_bytes is None:
        routed_bytes = expected
    elif abs(routed_bytes - expected) > 1e-9 * max(1.0, expected):
        raise r.fail("experts.routed_bytes", f"{routed_bytes:.0f} is not moe_layers x routed x expert_bytes "
                                             f"({expected:.0f})")

    r.mapping("weights", {"replicated_read_bytes", "replicated_resident_bytes"})
    rep_read = r.number("weights.replicated_read_bytes", positive=True)
    rep_res = r.number("weights.replicated_resident_bytes", positive=True)
    if rep_res < rep_read:
        raise r.fail("weights.replicated_resident_bytes", "is smaller than weights.replicated_read_bytes")

    tables: list[LookupTable] = []
    extra_bytes = 0.0
    eng = r.mapping("engram", {"layers", "rows", "row_bytes", "table_bytes", "projection_bytes", "rows_per_token"},
                    required=False)
    if eng is not None:
        lay = r.node("engram.layers")
        if not isinstance(lay, list) or not lay:
            raise r.fail("engram.layers", "expected a list with the consuming layer of each table")
        n = len(lay)
        lay_v = [r.number(f"engram.layers[{i}]", integer=True, value=x) for i, x in enumerate(lay)]
        for i, x in enumerate(lay_v):
            if x >= layers:
                raise r.fail(f"engram.layers[{i}]", f"layer {x} is outside the model's {layers} layers")
        rows = r.per_table("engram.rows", n, integer=True, split_total=False)
        row_bytes = r.per_table("engram.row_bytes", n, integer=True, split_total=False)
        rpt = r.per_table("engram.rows_per_token", n, integer=False, split_total=True)
        total = sum(a * b for a, b in zip(rows, row_bytes))
        given = r.number("engram.table_bytes", required=False)
        if given is not None and abs(given - total) > 0.5:
            raise r.fail("engram.table_bytes", f"{given:.0f} is not sum(rows) x row_bytes ({total:.0f})")
        extra_bytes = r.number("engram.projection_bytes", required=False) or 0.0
        tables = [LookupTable(name=f"engram{i}@layer{lay_v[i]}", layer=lay_v[i], rows=int(rows[i]),
                              row_bytes=int(row_bytes[i]), rows_per_token=float(rpt[i])) for i in range(n)]

    r.mapping("kv", {"capacity_bytes", "read_bytes_per_step"})
    kv_cap = r.linear("kv.capacity_bytes")
    kv_read = r.linear("kv.read_bytes_per_step")
    if kv_cap.fixed + kv_cap.per_context_token <= 0:
        raise r.fail("kv.capacity_bytes", "is zero: a session must hold some KV bytes")
    flops = r.linear("flops_per_token")
    if flops.fixed + flops.per_context_token <= 0:
        raise r.fail("flops_per_token", "is zero")
    dispatch = r.number("dispatch_bytes_per_token")
    if routed and moe_layers and dispatch == 0:
        raise r.fail("dispatch_bytes_per_token", "is zero for a model with routed experts")
    return DecodeInventory(
        name=name, layers=layers, moe_layers=moe_layers, hidden=hidden, max_context=max_ctx,
        replicated_read_bytes=rep_read, replicated_resident_bytes=rep_res, routed_experts=routed,
        experts_per_token=per_token, expert_bytes=expert_bytes, routed_bytes=routed_bytes,
        kv_capacity_bytes=kv_cap, kv_read_bytes=kv_read, flops_per_token=flops,
        dispatch_bytes_per_token=dispatch, tables=tuple(tables), table_extra_bytes=extra_bytes,
        source=str(p))
