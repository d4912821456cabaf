"""Objective ``energy`` (kJ): server power × servers × makespan (all servers of the
instance count as powered for the whole run); with faults, the worst case. Minimising it
is minimising the (worst-case) makespan."""
from __future__ import annotations

from objectives.deployment.makespan import worst_makespan

NAME = "energy"
UNIT = "kJ"


def apply(f) -> None:
    f.model.minimize(worst_makespan(f))


def value(evaluation) -> float:
    p = evaluation.problem
    return p.server.power_w * p.servers * evaluation.worst.makespan_s / 1e3


def from_makespan_s(problem, makespan_s: float) -> float:
    return problem.server.power_w * problem.servers * makespan_s / 1e3
