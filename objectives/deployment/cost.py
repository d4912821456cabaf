"""Objective ``cost`` (GPU·s per on-time session): every GPU of every server is billed from
t=0 until the last session finishes, divided by the sessions that finish on time; with faults,
the worst case over the scenarios: ``max_s G·M_s / on_s``. Solved by Dinkelbach's method
(see :mod:`objectives.deployment.base`)."""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from objectives.deployment.base import DeploymentObjective, apply_dinkelbach
from optimizer.deployment.units import TIME_UNIT_S


@dataclass(frozen=True)
class Cost(DeploymentObjective):
    def scenario_value(self, problem, r) -> float:
        return r.cost_gpu_s

    def apply(self, f, lam=None) -> None:
        apply_dinkelbach(self, f, lam)

    def numerators(self, f, scenario) -> list:
        g = f.problem.total_gpus
        return [g * term for term in scenario.makespan_terms]

    def ratio_in_unit(self, problem, ratio: Fraction) -> float:
        return float(ratio) * TIME_UNIT_S

    def numerator_bound(self, problem, makespan_ticks: int) -> Fraction:
        return Fraction(problem.total_gpus * int(makespan_ticks), len(problem.sessions))


OBJECTIVE = Cost(
    name="cost", unit="GPU·s per on-time session", default=True, kind="ratio", search="cost", min_on_time=1,
    decimals=3,
    definition="GPU·s billed per on-time session: every GPU of every server from t=0 until the last session "
               "finishes, divided by the sessions that finish by their deadline (worst fault scenario)")
