"""Build-out family ``rack_cover``: every server is placed in a rack.

Racks are modelled by *patterns* (the configuration formulation of bin packing): a pattern
is a cooling kind plus a count of servers per type that satisfies ``rack_power`` and
``rack_units`` and cannot take one more server of any type. ``y[p]`` racks use pattern p.
Because removing servers from a rack keeps it valid, covering (>=) is the same as exact
placement, and the rack counts are exact integers:

    sum_p a[p, t] * y[p] >= n[t]       for every server type t
    racks_air = sum_{p air} y[p],  racks_liquid = sum_{p liquid} y[p]
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "rack_cover"


def add(nm, ctx) -> None:
    for i, t in enumerate(ctx.problem.types):
        terms = [pat.counts[i] * y for pat, y in zip(ctx.patterns, ctx.y) if pat.counts[i] > 0]
        # no pattern holds this type (it fits no rack, or it has no room in the budget): none placed
        nm.add(ConstraintKey(FAMILY, t.name), (sum(terms) if terms else 0) >= ctx.n[t.name])


def describe(key: ConstraintKey, p) -> str:
    return f"every {key.element} server sits in a rack"
