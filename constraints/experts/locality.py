"""Locality family ``node_cover[layer L, expert e, node n]`` (objectives that cover nodes,
``inter-node``): ``u[e,n] = 1`` only if expert ``e`` has a replica on a GPU of node ``n``:

    u[e,n] <= sum_{g on node n} x[e,g]          node_cover[layer L, expert e, node n]

Tokens of ``e`` that originate on a covered node are served locally (see
``optimizer.experts.plan.cross_node_tokens`` for the traffic model); the objective weighs
each ``u[e,n]`` by ``w[e] / N``.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "node_cover"
KEY_FAMILIES = (FAMILY,)


def key(layer: int, expert: int, node: int) -> ConstraintKey:
    return ConstraintKey(FAMILY, f"layer {layer}, expert {expert}, node {node}")


def define(model, sp) -> None:
    """Add ``u[e,n]`` and its cover constraint for every expert and node not yet covered outside
    the sub-problem, when the objective covers nodes; records ``(weight, u)`` in
    ``model.cover_terms``."""
    if not sp.objective.covers_nodes:
        return
    m = model.cp
    nodes = sorted(set(sp.node_of))
    for it in sp.items:
        for n in nodes:
            if n in it.covered_outside or it.cover_weight == 0:
                continue
            on_node = [model.placed[it.e, g] for g, nn in zip(sp.gpus, sp.node_of)
                       if nn == n and (it.e, g) in model.placed]
            if not on_node:
                continue
            u = m.new_bool_var(f"u[{it.e},{n}]")
            model.add(key(sp.layer, it.e, n), u <= sum(on_node))
            model.cover_terms.append((it.cover_weight, u))


def describe(key_: ConstraintKey, sp) -> str:
    """One line on a ``node_cover`` key."""
    return f"{key_.element}: the expert counts as local to the node only with a replica on one of its GPUs"
