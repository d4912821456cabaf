"""Serving family ``capacity``: the workers of each role carry the request rate.

    Σ_{j in role} r_j·n_j >= R        for each role of the mode (aggregated; or prefill and decode)

with ``n_j`` the workers of configuration j (integer >= 0), ``r_j`` the largest rate one worker of
configuration j sustains within the SLOs (req/s, :mod:`optimizer.serving.perf`) and ``R`` the
target rate (req/s; a variable for ``goodput``).
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "capacity"


def key(role: str) -> ConstraintKey:
    return ConstraintKey(FAMILY, role)


def define(model, data) -> None:
    for role in data.roles:
        carried = sum(w.rate * x for w, x in zip(data.workers, model.x) if w.role == role)
        model.add(carried >= model.rate, key(role))


def describe(k: ConstraintKey, data) -> str:
    return f"{k.element} workers must carry {data.rate:g} requests/s within the SLOs"
