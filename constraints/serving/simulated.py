"""Serving family ``simulated``: the capacity the simulation of the trace (or the Poisson stream)
asked for, a cut added after a simulated attainment below the target.

    Σ_{j in role} r_j·n_j >= m_role·R        for each role whose margin m_role > 1

``m_role`` grows with the simulated shortfall of that role (TTFT misses grow the prefill or
aggregated workers, TPOT misses the decode or aggregated workers; :func:`optimizer.serving.plan_mode`);
``r_j`` and ``R`` as in ``capacity``. A plan of the re-solve carries at least that much rated
capacity; with every margin at 1 no row is added.
"""
from __future__ import annotations

from constraints.serving import pooling
from optimizer.result import ConstraintKey

FAMILY = "simulated"


def key(role: str) -> ConstraintKey:
    return ConstraintKey(FAMILY, role)


def define(model, data) -> None:
    for role in data.roles:
        m = data.margins.get(role, 1.0)
        if m > 1.0:
            model.add(pooling.carried(model, data, role) >= m * model.rate, key(role))


def describe(k: ConstraintKey, data) -> str:
    m = data.margins.get(k.element, 1.0)
    return (f"{k.element} workers must carry {m:.3g}x {data.rate:g} requests/s: the simulated attainment missed "
            f"the target with less")
