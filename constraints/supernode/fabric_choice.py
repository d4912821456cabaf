"""Supernode family ``fabric_choice``: exactly one candidate fabric is chosen, and only options
on the chosen fabric are built (one Boolean ``f_c`` per candidate fabric c = topology x
connection organisation, :mod:`optimizer.supernode.fabric`).

    sum_c f_c = 1                    fabric_choice[one fabric]
    x_o <= cards x f_c(o)            fabric_choice[<option label>]

Nothing is added without a ``supernode.fabric`` section.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "fabric_choice"
KEY_FAMILIES = (FAMILY,)
ONE = ConstraintKey(FAMILY, "one fabric")


def define(model, p) -> None:
    if p.fabric is None:
        return
    m = model.cp
    model.f = [m.new_bool_var(f"f[{c.label}]") for c in p.fabric.candidates]
    model.add(ONE, sum(model.f) == 1)
    for r, x, label in zip(model.results, model.x, model.labels):
        if r.option.candidate is not None:
            model.add(ConstraintKey(FAMILY, label), x <= p.cards * model.f[r.option.candidate])


def describe(key: ConstraintKey, p) -> str:
    if key == ONE:
        return f"one fabric of {len(p.fabric.candidates)} candidates"
    return f"{key.element}: built only on its own fabric"
