"""Serving family ``objective``: stage 2 keeps stage 1's optimum ``v`` of the objective ``f``.

    f(n, R) <= v·(1 + 1e-9) + 1e-9    (a minimised objective: gpus, dollars)
    f(n, R) >= v·(1 - 1e-9) - 1e-9    (a maximised one: goodput)

The tolerance (relative 1e-9, absolute 1e-9 in the objective's unit) keeps stage 1's plan feasible
against HiGHS's own feasibility tolerance (1e-7 on rows).
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "objective"
TOLERANCE = 1e-9


def key(name: str) -> ConstraintKey:
    return ConstraintKey(FAMILY, name)


def define(model, data, objective, value: float) -> None:
    """Add the row for ``objective`` (its ``expr(model)`` and ``sense``) held at ``value``."""
    expr = objective.expr(model)
    if objective.sense == "max":
        model.add(expr >= value * (1 - TOLERANCE) - TOLERANCE, key(objective.name))
    else:
        model.add(expr <= value * (1 + TOLERANCE) + TOLERANCE, key(objective.name))


def describe(k: ConstraintKey, data) -> str:
    return f"the {k.element} objective stays at its stage-1 optimum"
