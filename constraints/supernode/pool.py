"""Supernode family ``pool_capacity``: every instance's tables and KV placed in the memory pool fit it.

    sum_o x_o * pool_MB_o <= capacity_MB

Integer units: MB (1e6 bytes), usage rounded up and capacity down, so a plan that fits the
integer model fits the byte figures.
"""
from __future__ import annotations

import math

from optimizer.result import ConstraintKey

FAMILY = "pool_capacity"
KEY_FAMILIES = (FAMILY,)
KEY = ConstraintKey(FAMILY, "pool")


def usage_mb(r) -> int:
    return int(math.ceil(r.pool_bytes / 1e6 - 1e-9))


def define(model, p) -> None:
    if "pool" not in p.hw.tiers:
        return
    terms = [usage_mb(r) * x for r, x in zip(model.results, model.x) if r.pool_bytes > 0]
    if terms:
        model.add(KEY, sum(terms) <= int(math.floor(p.hw.tiers["pool"].capacity_bytes / 1e6 + 1e-9)))


def describe(key: ConstraintKey, p) -> str:
    return f"memory pool of {p.hw.tiers['pool'].capacity_bytes / 1e9:,.0f} GB shared by all instances"
