"""Build-out objective ``gpus``: the most GPUs the budget and limits allow (maximise sum_t g_t n_t)."""
from __future__ import annotations

NAME = "gpus"
SENSE = "max"
UNIT = "GPUs"
DEFINITION = "the most GPUs the power budget, racks, fabric and install units allow, GPUs"
DEFAULT = True


def expr(ctx):
    """Objective in model units (GPUs)."""
    return ctx.gpus


def to_unit(value: float, ctx) -> float:
    return int(round(value))
