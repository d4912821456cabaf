"""Family ``on_time[scenario]``: at least ``ceil(fraction · N)`` sessions finish by their
deadline, in the nominal run and in every fault scenario (``required`` is raised to 1 for
the cost objective, which divides by the on-time count).
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "on_time"


def add(f) -> None:
    need = f.required
    if need <= 0:
        return
    for sc in f.scenarios:
        if isinstance(sc.on_time, int):
            zero = f.model.new_constant(sc.on_time)
            f.nm.add(ConstraintKey(FAMILY, sc.label), zero >= need, enforce=sc.enforce)
        else:
            f.nm.add(ConstraintKey(FAMILY, sc.label), sc.on_time >= need, enforce=sc.enforce)
