"""Serving family ``capacity``: the workers of each role carry the request rate.

    Σ_{j in role} r_j·n_j >= R        for each role of the mode (aggregated; or prefill and decode)

with ``n_j`` the workers of configuration j (integer >= 0), ``r_j`` the largest rate one worker of
configuration j sustains within the SLOs (req/s, :mod:`optimizer.serving.perf`) and ``R`` the
target rate (req/s; a variable for ``goodput``). Prefill configurations with a pooling gain carry
their pooled rate instead of ``r_j·n_j`` (:mod:`constraints.serving.pooling`).
"""
from __future__ import annotations

from constraints.serving import pooling
from optimizer.result import ConstraintKey

FAMILY = "capacity"


def key(role: str) -> ConstraintKey:
    return ConstraintKey(FAMILY, role)


def define(model, data) -> None:
    for role in data.roles:
        model.add(pooling.carried(model, data, role) >= model.rate, key(role))


def describe(k: ConstraintKey, data) -> str:
    return f"{k.element} workers must carry {data.rate:g} requests/s within the SLOs"
