"""Build-out objective ``cost``: the cheapest set of servers with at least ``target_gpus`` GPUs.

Model units are hundredths of the cost unit (``ServerType.cost_c``); racks and switches carry
no cost here (they are the secondary objectives).
"""
from __future__ import annotations

NAME = "cost"
SENSE = "min"
UNIT = "cost unit of the server catalog (see objective.unit of a result)"
DEFINITION = "the lowest purchase cost of the servers of a build-out with at least target_gpus GPUs, in the catalog's cost unit"


def unit(problem) -> str:
    return problem.cost_unit


def expr(ctx):
    return ctx.cost_c


def to_unit(value: float, ctx) -> float:
    return round(value / 100.0, 2)
