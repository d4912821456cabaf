"""Load family ``gpu_load[layer L, gpu g]``: tokens computed on a GPU stay under the cap ``T``.

Even split (EPLB's assumption): a replica of expert ``e`` with ``k`` replicas computes
``w[e] / k`` tokens; the count is a decision, so the load is ``sum_{e,k} (w[e]/k) z[e,g,k]``
(linear in the Booleans ``z``). Optimised split: ``sum_e s[e,g]`` with integer shares
``s[e,g] <= w[e] * x[e,g]`` and ``sum_g s[e,g] = w[e]`` (family ``token_split``).
Loads are integers in the model's load unit (see ``optimizer.experts.model``: tokens times
a documented scale).
"""
from __future__ import annotations

from ortools.sat.python import cp_model

from optimizer.cpsat import NamedModel
from optimizer.result import ConstraintKey

FAMILY = "gpu_load"
SPLIT_FAMILY = "token_split"


def key(layer: int, gpu: int) -> ConstraintKey:
    return ConstraintKey(FAMILY, f"layer {layer}, gpu {gpu}")


def add(nm: NamedModel, layer: int, gpu: int, terms: list[tuple[int, cp_model.IntVar]], cap) -> cp_model.LinearExpr:
    """``sum(coef * var) <= cap``; returns the load expression."""
    expr = cp_model.LinearExpr.weighted_sum([v for _, v in terms], [c for c, _ in terms]) if terms else 0
    nm.add(key(layer, gpu), expr <= cap)
    return expr


def add_split(nm: NamedModel, layer: int, expert: int, x: dict[int, cp_model.IntVar],
              s: dict[int, cp_model.IntVar], amount: int) -> None:
    """Shares of one expert: ``s[g] <= amount * x[g]`` and ``sum_g s[g] == amount``."""
    k_ = ConstraintKey(SPLIT_FAMILY, f"layer {layer}, expert {expert}")
    for g in s:
        nm.add(k_, s[g] <= amount * x[g])
    nm.add(k_, sum(s.values()) == amount)
