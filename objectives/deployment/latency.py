"""Objective ``latency`` (ms): mean session finish time over all sessions (late ones
included); with faults, the worst case over the fault scenarios. Needs the sequence
formulation (finish times depend on the order on each instance)."""
from __future__ import annotations

from dataclasses import dataclass

from objectives.deployment.base import DeploymentObjective, ticks_to_ms


@dataclass(frozen=True)
class Latency(DeploymentObjective):
    def scenario_value(self, problem, r) -> float:
        return r.mean_finish_s * 1e3

    def apply(self, f, lam=None) -> None:
        lw = f.model.new_int_var(0, f.horizon * max(1, f.n_sessions), "worst_finish_sum")
        for sc in f.scenarios:
            ct = f.model.add(lw >= sc.finish_sum)
            if sc.enforce:
                ct.only_enforce_if(sc.enforce)
        f.model.minimize(lw)

    def column_cost(self, gpus: int, load_ticks: int, finish_ticks: int = 0) -> int:
        """Batched search: the sum of the instance's sessions' finish times (ticks)."""
        return finish_ticks

    def bound_in_unit(self, problem, solver_bound: float) -> float:
        return ticks_to_ms(solver_bound) / len(problem.sessions)


OBJECTIVE = Latency(
    name="latency", unit="ms", kind="finish_sum", needs_sequence=True,
    definition="mean session finish time from t=0 over all sessions (late ones included), ms "
               "(worst fault scenario)")
