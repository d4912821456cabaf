"""Replica-count family ``replica_count[layer L, expert e]`` (expert placement).

Every logical expert chooses one replica count from its allowed options (>= 1 in the whole
layer; a sub-problem may fix the count of experts that also have replicas outside it), and
places exactly that many replicas, on distinct GPUs (``X[e, g]`` is 0/1, which is the
family ``distinct_gpus``: it holds by construction of the Boolean variables).
"""
from __future__ import annotations

from ortools.sat.python import cp_model

from optimizer.cpsat import NamedModel
from optimizer.result import ConstraintKey

FAMILY = "replica_count"


def key(layer: int, expert: int) -> ConstraintKey:
    return ConstraintKey(FAMILY, f"layer {layer}, expert {expert}")


def add(nm: NamedModel, layer: int, expert: int, z: dict[int, dict[int, cp_model.IntVar]],
        y: dict[int, cp_model.IntVar | int]) -> None:
    """``sum_g z[k][g] == k * y[k]`` for every count option ``k`` and ``sum_k y[k] == 1``.

    Args:
        z: count option ``k`` -> GPU -> Boolean "a replica of this expert on this GPU, and
            the expert has ``k`` replicas here".
        y: count option ``k`` -> Boolean (or the constant 1 when there is one option).
    """
    k_ = key(layer, expert)
    for k, zk in z.items():
        nm.add(k_, sum(zk.values()) == k * y[k])
    if len(y) > 1:
        nm.add(k_, sum(y.values()) == 1)


def add_split(nm: NamedModel, layer: int, expert: int, x: dict[int, cp_model.IntVar], min_replicas: int) -> None:
    """Optimised split: at least ``min_replicas`` replicas (1 when the expert lives only here)."""
    if min_replicas > 0:
        nm.add(key(layer, expert), sum(x.values()) >= min_replicas)
