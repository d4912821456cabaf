"""Build-out family ``target``: at least ``target_gpus`` GPUs (required by the cost and racks objectives;
with the gpus objective a given target is a lower bound)."""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "target"
KEY = ConstraintKey(FAMILY, "gpus")


def add(nm, ctx) -> None:
    if ctx.problem.target_gpus is not None:
        nm.add(KEY, ctx.gpus >= ctx.problem.target_gpus)


def describe(key: ConstraintKey, p) -> str:
    return f"at least {p.target_gpus} GPUs"
