"""Build-out objective ``cost``: the cheapest set of servers with at least ``target_gpus`` GPUs.

Model units are hundredths of the cost unit (``ServerType.cost_c``); racks and switches carry
no cost here (they are the secondary objectives).
"""
from __future__ import annotations

NAME = "cost"
SENSE = "min"
UNIT = "cost unit of the server catalog (see objective.unit of a result)"
DEFINITION = "the lowest purchase cost of the servers of a build-out with at least target_gpus GPUs, in the catalog's cost unit"


NEEDS_TARGET = True  # the cheapest plan of what size: target_gpus
NEEDS_COST = True  # every server type needs a cost
SHORT_UNIT = "cost"
NEXT_UNIT_HINT = False


def min_gpus_better_than(value: float) -> int:
    """GPUs a plan strictly better than ``value`` must hold at least (a hint for the model build)."""
    return 0


def better_than(ctx, value: float):
    """Constraint: a plan strictly cheaper than ``value`` (model units are hundredths)."""
    return ctx.cost_c <= int(round(value * 100)) - 1

def unit(problem) -> str:
    return problem.cost_unit


def expr(ctx):
    return ctx.cost_c


def to_unit(value: float, ctx) -> float:
    return round(value / 100.0, 2)
