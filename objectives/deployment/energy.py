"""Objective ``energy`` (kJ): server power × servers × makespan (all servers of the
instance count as powered for the whole run); with faults, the worst case. Minimising it
is minimising the (worst-case) makespan."""
from __future__ import annotations

from dataclasses import dataclass

from objectives.deployment.base import DeploymentObjective
from objectives.deployment.makespan import worst_makespan
from optimizer.deployment.units import TIME_UNIT_S


def from_makespan_s(problem, makespan_s: float) -> float:
    """kJ of all servers powered for ``makespan_s`` seconds."""
    return problem.server.power_w * problem.servers * makespan_s / 1e3


@dataclass(frozen=True)
class Energy(DeploymentObjective):
    def scenario_value(self, problem, r) -> float:
        return from_makespan_s(problem, r.makespan_s)

    def apply(self, f, lam=None) -> None:
        f.model.minimize(worst_makespan(f))

    def bound_in_unit(self, problem, solver_bound: float) -> float:
        return from_makespan_s(problem, solver_bound * TIME_UNIT_S)


OBJECTIVE = Energy(
    name="energy", unit="kJ", kind="makespan", search="makespan",
    definition="energy of all servers at their rated power from t=0 until the last session finishes, kJ "
               "(worst fault scenario)")
