"""Locality family ``node_cover[layer L, expert e, node n]`` (inter-node objective).

``u[e,n] = 1`` only if expert ``e`` has a replica on a GPU of node ``n``; tokens of ``e``
that originate on a covered node are served locally (see
``optimizer.experts.plan.cross_node_tokens`` for the traffic model).
"""
from __future__ import annotations

from ortools.sat.python import cp_model

from optimizer.cpsat import NamedModel
from optimizer.result import ConstraintKey

FAMILY = "node_cover"


def add(nm: NamedModel, layer: int, expert: int, node: int, u: cp_model.IntVar, x_on_node: list) -> None:
    """``u <= sum(x on the node's GPUs)``."""
    nm.add(ConstraintKey(FAMILY, f"layer {layer}, expert {expert}, node {node}"), u <= sum(x_on_node))
