"""Build-out objective ``gpus``: the most GPUs the budget and limits allow (maximise sum_t g_t n_t)."""
from __future__ import annotations

NAME = "gpus"
SENSE = "max"
UNIT = "GPUs"
DEFINITION = "the most GPUs the power budget, racks, fabric and install units allow, GPUs"
DEFAULT = True


NEEDS_TARGET = False  # the objective itself sizes the hall
NEEDS_COST = False
SHORT_UNIT = "GPUs"  # how "a better plan" is named in explanations
NEXT_UNIT_HINT = True  # explanations say what the next install unit would need


def min_gpus_better_than(value: float) -> int:
    """GPUs a plan strictly better than ``value`` must hold at least (a hint for the model build)."""
    return int(value) + 1


def better_than(ctx, value: float):
    """Constraint: a plan strictly better than ``value`` (GPUs)."""
    return ctx.gpus >= int(value) + 1

def expr(ctx):
    """Objective in model units (GPUs)."""
    return ctx.gpus


def to_unit(value: float, ctx) -> float:
    return int(round(value))
