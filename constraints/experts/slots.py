"""Slot family ``gpu_slots[layer L, gpu g]``: exactly ``slots[g]`` physical replicas per GPU.

    sum_{e,k} z[e,g,k] = slots[g]   (even split)      sum_e x[e,g] = slots[g]   (optimised split)
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "gpu_slots"
KEY_FAMILIES = (FAMILY,)


def key(layer: int, gpu: int) -> ConstraintKey:
    return ConstraintKey(FAMILY, f"layer {layer}, gpu {gpu}")


def define(model, sp) -> None:
    """``sum(replicas on g) == slots[g]`` for every GPU of the (sub-)problem ``sp``."""
    for g, slots in zip(sp.gpus, sp.slots):
        model.add(key(sp.layer, g), sum(model.slot_terms[g]) == slots)


def describe(key_: ConstraintKey, sp) -> str:
    """One line on a ``gpu_slots`` key (``sp``: the sub-problem, or None: no slot count known)."""
    gpu = int(key_.element.rsplit("gpu ", 1)[1])
    slots = dict(zip(sp.gpus, sp.slots)).get(gpu) if sp is not None else None
    held = f"exactly {slots}" if slots is not None else "its number of"
    return f"{key_.element}: the GPU holds {held} expert replicas"
