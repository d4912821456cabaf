"""Serving family ``homogeneous`` (``serving.homogeneous: true``): at most one worker
configuration per role, so each role deploys one engine configuration.

    n_j <= N_j·z_j         for each configuration j (z_j binary, N_j the workers its pool holds)
    Σ_{j in role} z_j <= 1  for each role of the mode

Rows ``homogeneous[<configuration>]`` and ``homogeneous[<role>]``; none when the option is off.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "homogeneous"


def key(element: str) -> ConstraintKey:
    return ConstraintKey(FAMILY, element)


def define(model, data) -> None:
    p = data.problem
    if not p.homogeneous:
        return
    chosen = {}
    for w, x in zip(data.workers, model.x):
        label = w.label(p)
        z = model.h.addBinary(name=f"z[{label}]")
        model.add(x <= max(1, p.pools[w.pool].count // w.gpus) * z, key(label))
        chosen.setdefault(w.role, []).append(z)
    for role in data.roles:
        if chosen.get(role):
            model.add(sum(chosen[role]) <= 1, key(role))


def describe(k: ConstraintKey, data) -> str:
    if k.element in ("aggregated", "prefill", "decode"):
        return f"serving.homogeneous: one {k.element} configuration at most"
    return f"serving.homogeneous: {k.element} has workers only if it is its role's one configuration"
