"""Slot family ``gpu_slots[layer L, gpu g]``: exactly ``slots[g]`` physical replicas per GPU."""
from __future__ import annotations

from optimizer.cpsat import NamedModel
from optimizer.result import ConstraintKey

FAMILY = "gpu_slots"


def key(layer: int, gpu: int) -> ConstraintKey:
    return ConstraintKey(FAMILY, f"layer {layer}, gpu {gpu}")


def add(nm: NamedModel, layer: int, gpu: int, replicas: list, slots: int) -> None:
    """``sum(replicas on gpu) == slots``."""
    nm.add(key(layer, gpu), sum(replicas) == slots)
