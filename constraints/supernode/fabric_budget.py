"""Supernode families ``fabric_power`` and ``switch_chips``: the fabrics of all built instances
stay within the fabric's power and switch-chip limits (``supernode.fabric.max_power_kw``,
``max_switch_chips``; nothing is added when a limit is not given).

    sum_o x_o * ceil(P_o)  <= floor(max_power_kw x 1000)     fabric_power[total]   (whole W)
    sum_o x_o * chips_o    <= max_switch_chips               switch_chips[total]

``P_o`` = port links x ``link_power_w`` + switch chips x ``switch_power_w`` of option o's fabric
for one domain (:mod:`optimizer.supernode.fabric`).
"""
from __future__ import annotations

import math

from optimizer.result import ConstraintKey

FAMILY = "fabric_budget"
POWER = ConstraintKey("fabric_power", "total")
CHIPS = ConstraintKey("switch_chips", "total")
KEY_FAMILIES = (POWER.family, CHIPS.family)


def power_w(r) -> int:
    """Whole watts of one domain's fabric, rounded up."""
    from optimizer.supernode.perf import FABRIC

    return 0 if r.option.fabric != FABRIC or r.fabric is None else int(math.ceil(r.fabric.power_w - 1e-9))


def chips(r) -> int:
    return 0 if r.fabric is None else r.fabric.switch_chips


def define(model, p) -> None:
    fs = p.fabric
    if fs is None:
        return
    if fs.max_power_w is not None:
        model.add(POWER, sum(power_w(r) * x for r, x in zip(model.results, model.x))
                  <= int(math.floor(fs.max_power_w + 1e-9)))
    if fs.max_switch_chips is not None:
        model.add(CHIPS, sum(chips(r) * x for r, x in zip(model.results, model.x)) <= fs.max_switch_chips)


def describe(key: ConstraintKey, p) -> str:
    fs = p.fabric
    if key == POWER:
        return f"fabric power at most {fs.max_power_w / 1e3:g} kW"
    return f"at most {fs.max_switch_chips} switch chips"
