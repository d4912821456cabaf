"""Build-out family ``target``: at least ``target_gpus`` GPUs (required by the cost and racks objectives;
with the gpus objective a given target is a lower bound).

    sum_t g_t n[t] >= target_gpus      target[gpus]
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "target"
KEY = ConstraintKey(FAMILY, "gpus")


def define(model, p) -> None:
    if p.target_gpus is not None:
        model.add(KEY, model.gpus >= p.target_gpus)


def describe(key: ConstraintKey, p) -> str:
    return f"at least {p.target_gpus} GPUs"
