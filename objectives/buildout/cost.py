"""Build-out objective ``cost``: the cheapest set of servers with at least ``target_gpus`` GPUs.

Model units are hundredths of the cost unit (``ServerType.cost_c``); racks and switches carry
no cost here (they are the secondary objectives).
"""
from __future__ import annotations

from dataclasses import dataclass

from objectives.buildout import BuildoutObjective


@dataclass(frozen=True)
class LeastCost(BuildoutObjective):
    def expr(self, model):
        return model.cost_c

    def to_unit(self, value: float, model) -> float:
        return round(value / 100.0, 2)

    def better_than(self, model, value: float):
        """A plan strictly cheaper than ``value`` (model units are hundredths)."""
        return model.cost_c <= int(round(value * 100)) - 1

    def unit_for(self, problem) -> str:
        return problem.cost_unit


OBJECTIVE = LeastCost(
    name="cost", unit="cost unit of the server catalog (see objective.unit of a result)", sense="min",
    definition="the lowest purchase cost of the servers of a build-out with at least target_gpus GPUs, "
               "in the catalog's cost unit",
    needs_target=True, needs_cost=True, short_unit="cost", next_unit_hint=False)
