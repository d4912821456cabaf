"""Build-out family ``power``: the hall's power budget (reference chapter, eq. 6-11).

For one server type the chapter's rule is ``N <= g * floor((P_budget - P0) / P_server)``.
Generalised to several types, install units and second-tier switching (watts, integers):

    P0 + sum_t P_t * n[t] + P_2 * z + P_sw * (leaves + spines) <= P_budget

where ``z`` = 1 when the GPUs exceed one fabric tier (:mod:`constraints.buildout.second_tier`)
and ``P_sw`` is ``fabric.switch_power_kw`` per switch chip (:mod:`constraints.buildout.fabric`).
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "power"
KEY = ConstraintKey(FAMILY, "budget")


def define(model, p) -> None:
    model.add(KEY, model.power_w <= p.budget_w)


def describe(key: ConstraintKey, p) -> str:
    return f"power budget {p.power_budget_kw:g} kW with {p.fixed_power_kw:g} kW of fixed load"
