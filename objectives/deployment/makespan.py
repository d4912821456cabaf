"""Objective ``makespan`` (ms): time until the last session finishes; with faults, the
worst case over the fault scenarios. ``Mw ≥ every makespan term of every scenario``."""
from __future__ import annotations

NAME = "makespan"
UNIT = "ms"


def worst_makespan(f):
    """Integer variable (ticks) bounded below by the makespan of every scenario."""
    if getattr(f, "_worst_makespan", None) is not None:
        return f._worst_makespan
    mw = f.model.new_int_var(0, f.horizon, "worst_makespan")
    for sc in f.scenarios:
        for term in sc.makespan_terms:
            f.model.add(mw >= term).only_enforce_if(sc.enforce) if sc.enforce else f.model.add(mw >= term)
    f._worst_makespan = mw
    return mw


def apply(f) -> None:
    f.model.minimize(worst_makespan(f))


def value(evaluation) -> float:
    """Objective value of an evaluated plan (ms)."""
    return evaluation.worst.makespan_s * 1e3
