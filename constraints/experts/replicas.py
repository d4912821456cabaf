"""Replica-count family ``replica_count[layer L, expert e]`` (expert placement).

Every logical expert chooses one replica count from its allowed options (>= 1 in the whole
layer; a sub-problem may fix the count of experts that also have replicas outside it), and
places exactly that many replicas, on distinct GPUs (``X[e, g]`` is 0/1, which is the
family ``distinct_gpus``: it holds by construction of the Boolean variables):

    sum_g z[e,g,k] = k y[e,k]  for every option k,   sum_k y[e,k] = 1     (even split)
    min_inside <= sum_g x[e,g] <= max_inside                               (optimised split)
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "replica_count"
DISTINCT = "distinct_gpus"  # holds by construction; named in conflicts
KEY_FAMILIES = (FAMILY, DISTINCT)


def key(layer: int, expert: int) -> ConstraintKey:
    return ConstraintKey(FAMILY, f"layer {layer}, expert {expert}")


def define(model, sp) -> None:
    """Every expert's replica count (``model``: :class:`optimizer.experts.model.LayerModel`)."""
    for it in sp.items:
        k_ = key(sp.layer, it.e)
        if sp.split == "even":
            z, y = model.z[it.e], model.y[it.e]
            for k, zk in z.items():
                model.add(k_, sum(zk.values()) == k * y[k])
            if len(y) > 1:
                model.add(k_, sum(y.values()) == 1)
        else:
            x = model.x[it.e]
            if it.min_inside > 0:  # at least one replica when the expert lives only here
                model.add(k_, sum(x.values()) >= it.min_inside)
            if it.max_inside < len(sp.gpus):
                model.add(k_, sum(x.values()) <= it.max_inside)


def describe(key_: ConstraintKey, sp) -> str:
    """One line on a ``replica_count`` or ``distinct_gpus`` key."""
    if key_.family == DISTINCT:
        return f"{key_.element}: replicas of one expert sit on distinct GPUs"
    return f"{key_.element}: the expert has one of its allowed replica counts, each replica on its own GPU"
