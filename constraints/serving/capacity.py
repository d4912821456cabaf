"""Serving family ``capacity``: the workers of each role carry the request rate.

    Σ_{j in role} r_j·n_j >= R        (role: aggregated; or prefill and decode)
    Σ_{j in role} n_j >= 1            (``deploy[role]``: every role has a worker, whatever the rate)

with ``r_j`` the largest rate one worker of configuration j sustains within the SLOs
(:mod:`optimizer.serving.perf`) and ``R`` the target rate (a variable for ``goodput``).
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "capacity"


def key(role: str) -> ConstraintKey:
    return ConstraintKey(FAMILY, role)


def add(prob, ctx) -> None:
    for role in ctx.roles:
        terms = [w.rate * x for w, x in zip(ctx.workers, ctx.x) if w.role == role]
        prob += (sum(terms) >= ctx.rate, ctx.name(key(role)))
        prob += (sum(x for w, x in zip(ctx.workers, ctx.x) if w.role == role) >= 1,
                 ctx.name(ConstraintKey("deploy", role)))


def describe(k: ConstraintKey, ctx) -> str:
    return f"{k.element} workers must carry {ctx.rate_value:g} requests/s within the SLOs"
