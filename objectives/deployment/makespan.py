"""Objective ``makespan`` (ms): time until the last session finishes; with faults, the
worst case over the fault scenarios. ``Mw ≥ every makespan term of every scenario``."""
from __future__ import annotations

from dataclasses import dataclass

from objectives.deployment.base import DeploymentObjective, ticks_to_ms


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


@dataclass(frozen=True)
class Makespan(DeploymentObjective):
    def scenario_value(self, problem, r) -> float:
        return r.makespan_s * 1e3

    def apply(self, f, lam=None) -> None:
        f.model.minimize(worst_makespan(f))

    def bound_in_unit(self, problem, solver_bound: float) -> float:
        return ticks_to_ms(solver_bound)


OBJECTIVE = Makespan(
    name="makespan", unit="ms", kind="makespan", search="makespan",
    definition="time from t=0 until the last session finishes, ms (worst fault scenario)")
