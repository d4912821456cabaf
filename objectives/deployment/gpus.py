"""Objective ``gpus``: the fewest GPUs in instances that meet every requirement (memory,
deadlines, the on-time fraction, every fault scenario); only GPUs in instances count, so
adding servers never makes a plan look worse. Among plans with that many GPUs, the one of
smallest worst-case makespan is returned (a second solve with the GPU count fixed).

``minimise Σ_k p_k · used_k`` over the candidate instances k of TP degree p_k.
"""
from __future__ import annotations

from dataclasses import dataclass

from objectives.deployment.base import DeploymentObjective


@dataclass(frozen=True)
class Gpus(DeploymentObjective):
    def scenario_value(self, problem, r) -> float:
        return float(r.gpus_used)

    def fmt(self, value: float) -> str:
        return f"{value:.0f} {self.unit}"

    def expression(self, f):
        return sum(k.degree * f.used[k.index] for k in f.slots)

    def apply(self, f, lam=None) -> None:
        f.model.minimize(self.expression(f))

    def column_cost(self, gpus: int, load_ticks: int, finish_ticks: int = 0) -> int:
        return gpus

    def bound_in_unit(self, problem, solver_bound: float) -> float:
        return float(solver_bound)


OBJECTIVE = Gpus(
    name="gpus", unit="GPUs", kind="count", lp_bound="gpus",
    definition="GPUs in instances of the plan (idle GPUs and servers are not counted); "
               "ties broken by the smallest makespan")
