"""Family ``on_time[scenario]``: at least ``ceil(fraction · N)`` sessions finish by their
deadline, in the nominal run and in every fault scenario (``required`` is raised to 1 for
the cost objective, which divides by the on-time count).
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "on_time"


def define(f, problem) -> None:
    """Add the family's constraints to the formulation ``f`` of ``problem`` (see the module docstring)."""
    need = f.required
    if need <= 0:
        return
    for sc in f.scenarios:
        if isinstance(sc.on_time, int):
            zero = f.model.new_constant(sc.on_time)
            f.nm.add(ConstraintKey(FAMILY, sc.label), zero >= need, enforce=sc.enforce)
        else:
            f.nm.add(ConstraintKey(FAMILY, sc.label), sc.on_time >= need, enforce=sc.enforce)


def describe(key: ConstraintKey, f) -> str:
    required = f.required if f is not None else f.problem.required_on_time
    return f"{key}: at least {required} of {len(f.problem.sessions)} sessions on time"
