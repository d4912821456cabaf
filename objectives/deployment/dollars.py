"""Objective ``dollars`` ($ per on-time session): each instance's GPUs are billed at the GPU's
``dollars_per_gpu_hour`` from t=0 until that instance's last session finishes (GPUs that hold
no instance, or have finished, are not billed), divided by the sessions that finish on time;
with faults, the worst case over the scenarios. The plan's rate while all its instances run,
``$/hour = GPUs in instances × dollars_per_gpu_hour``, is reported beside it.

Solved by Dinkelbach's method on ``Σ_k p_k · W_k / on``, with ``W_k`` the nominal busy time
of instance k: a fault only delays, so the solver's ratio is a lower bound of the evaluated
worst case, and the plan is reported optimal only when the two meet.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from objectives.deployment.base import DeploymentObjective, apply_dinkelbach
from optimizer.deployment.units import TIME_UNIT_S
from optimizer.errors import InputError


def price(problem) -> float:
    return problem.gpu.dollars_per_gpu_hour


@dataclass(frozen=True)
class Dollars(DeploymentObjective):
    def check(self, problem) -> None:
        if price(problem) is None:
            raise InputError(problem.path, "hardware.gpu.dollars_per_gpu_hour",
                             f"--objective dollars needs a GPU price: the catalog has none for "
                             f"'{problem.gpu.name}'; give hardware.gpu as a mapping with dollars_per_gpu_hour "
                             f"or --set hardware.dollars_per_gpu_hour=...")

    def fmt(self, value: float) -> str:
        return f"{value:.4g} {self.unit}"

    def scenario_value(self, problem, r) -> float:
        if r.on_time == 0:
            return float("inf")
        return price(problem) * r.billed_gpu_s / 3600.0 / r.on_time

    def apply(self, f, lam=None) -> None:
        apply_dinkelbach(self, f, lam)

    def numerators(self, f, scenario) -> list:
        return [sum(k.degree * f.W[k.index] for k in f.slots)]

    def column_cost(self, gpus: int, load_ticks: int, finish_ticks: int = 0) -> int:
        """GPU·ticks billed for one instance (the numerator is their sum)."""
        return gpus * load_ticks

    def ratio_in_unit(self, problem, ratio: Fraction) -> float:
        return float(ratio) * TIME_UNIT_S * price(problem) / 3600.0


OBJECTIVE = Dollars(
    name="dollars", unit="$ per on-time session", kind="ratio", min_on_time=1, decimals=4, lp_bound="gpu_time",
    fault_note="with faults the solver bills each instance's nominal busy time (a valid lower bound); the "
               "evaluated worst case adds the fault's delay, so the gap can remain when the search ends",
    definition="dollars per on-time session: each instance's GPUs billed at dollars_per_gpu_hour from t=0 until "
               "that instance's last session finishes, divided by the sessions on time (worst fault scenario)")
