"""Build-out family ``rack_cover``: every server (and every racked switch chip) is placed in a rack.

Racks are modelled by *patterns* (the configuration formulation of bin packing): a pattern
is a cooling kind plus a count of items per kind (server types; switch chips when
``fabric.switch_rack_units`` or ``switch_power_kw`` is set) that satisfies ``rack_power``,
``rack_feed`` and ``rack_units`` and cannot take one more item of any kind. ``y[p]`` racks
use pattern p. Because removing items from a rack keeps it valid, covering (>=) is the same
as exact placement, and the rack counts are exact integers:

    sum_p a[p, t] * y[p] >= n[t]                   rack_cover[<type>], every server type t
    sum_p a[p, sw] * y[p] >= leaves + spine        rack_cover[switches]
    racks_air = sum_{p air} y[p],  racks_liquid = sum_{p liquid} y[p]

A server type that fits no rack is in no pattern; it is pinned to zero by ``rack_power``,
``rack_feed`` or ``rack_units`` under its own name (so a conflict names the reason), and no
cover constraint is added for it.
"""
from __future__ import annotations

from constraints.buildout import rack_feed, rack_power, rack_units
from optimizer.result import ConstraintKey

FAMILY = "rack_cover"
SWITCHES = ConstraintKey(FAMILY, "switches")


def unfit_families(p, power_w: int, units: int) -> list[str]:
    """The families (``rack_power``, ``rack_feed``, ``rack_units``) that keep an item of
    ``power_w`` W and ``units`` U out of every rack; empty when some rack can hold it."""
    out = []
    if rack_power.excludes(p, power_w):
        out.append(rack_power.FAMILY)
    if rack_feed.excludes(p, power_w):
        out.append(rack_feed.FAMILY)
    if rack_units.excludes(p, units):
        out.append(rack_units.FAMILY)
    return out


def define(model, p) -> None:
    for i, t in enumerate(p.types):
        terms = [pat.counts[i] * y for pat, y in zip(model.patterns, model.y) if pat.counts[i] > 0]
        if not terms and unfit_families(p, t.power_w, t.rack_units):
            continue
        # no pattern holds this type although it fits a rack: its bound is 0 (no room in the budget)
        model.add(ConstraintKey(FAMILY, t.name), (sum(terms) if terms else 0) >= model.n[t.name])
    f = p.fabric
    if f is not None and f.switches_in_racks:
        i = len(p.types)
        terms = [pat.counts[i] * y for pat, y in zip(model.patterns, model.y) if pat.counts[i] > 0]
        if terms or not unfit_families(p, f.switch_power_w, f.switch_rack_units):
            model.add(SWITCHES, (sum(terms) if terms else 0) >= model.leaves + model.s)


def describe(key: ConstraintKey, p) -> str:
    if key == SWITCHES:
        f = p.fabric
        return (f"every switch chip sits in a rack ({f.switch_rack_units}U, "
                f"{f.switch_power_kw:g} kW each)")
    return f"every {key.element} server sits in a rack"
