"""Load family ``gpu_load[layer L, gpu g]``: tokens computed on a GPU stay under the cap ``T``.

Even split (EPLB's assumption): a replica of expert ``e`` with ``k`` replicas computes
``w[e] / k`` tokens; the count is a decision, so the load is linear in the Booleans ``z``:

    sum_{e,k} (w[e]/k) z[e,g,k] <= T                     gpu_load[layer L, gpu g]

Optimised split: integer shares ``s[e,g]`` of each expert's tokens on the GPUs holding it:

    sum_e s[e,g] <= T                                    gpu_load[layer L, gpu g]
    s[e,g] <= w[e] x[e,g],  sum_g s[e,g] = w[e]          token_split[layer L, expert e]

Loads are integers in the model's load unit (see ``optimizer.experts.model``: tokens times
a documented scale).
"""
from __future__ import annotations

from optimizer.cpsat import ortools_cp_model
from optimizer.result import ConstraintKey

FAMILY = "gpu_load"
SPLIT_FAMILY = "token_split"
KEY_FAMILIES = (FAMILY, SPLIT_FAMILY)


def key(layer: int, gpu: int) -> ConstraintKey:
    return ConstraintKey(FAMILY, f"layer {layer}, gpu {gpu}")


def split_key(layer: int, expert: int) -> ConstraintKey:
    return ConstraintKey(SPLIT_FAMILY, f"layer {layer}, expert {expert}")


def define(model, sp) -> None:
    """Add the token splits (optimised split) and every GPU's load cap; records each GPU's load
    expression in ``model.loads`` (``model``: :class:`optimizer.experts.model.LayerModel`,
    ``sp``: its :class:`optimizer.experts.model.SubProblem`)."""
    cp_model = ortools_cp_model()
    if sp.split == "optimal":
        for it in sp.items:
            x, s = model.x[it.e], model.s[it.e]
            k_ = split_key(sp.layer, it.e)
            for g in s:
                model.add(k_, s[g] <= it.amount * x[g])
            model.add(k_, sum(s.values()) == it.amount)
    for g in sp.gpus:
        terms = model.load_terms[g]
        expr = cp_model.LinearExpr.weighted_sum([v for _, v in terms], [c for c, _ in terms]) if terms else 0
        model.add(key(sp.layer, g), expr <= model.T)
        model.loads[g] = expr


def describe(key_: ConstraintKey, sp) -> str:
    """One line on a ``gpu_load`` or ``token_split`` key."""
    if key_.family == SPLIT_FAMILY:
        return f"{key_.element}: the expert's tokens are split over the GPUs holding it, all of them placed"
    return f"{key_.element}: the GPU's routed tokens stay within the max load"
