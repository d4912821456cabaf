"""Serving family ``gpus``: the workers on each pool use at most its GPUs.

    Σ_{j on pool} g_j·n_j <= count_pool
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "gpus"


def key(pool_name: str) -> ConstraintKey:
    return ConstraintKey(FAMILY, f"pool {pool_name}")


def add(prob, ctx) -> None:
    for i, pool in enumerate(ctx.problem.pools):
        terms = [w.gpus * x for w, x in zip(ctx.workers, ctx.x) if w.pool == i]
        if terms:
            prob += (sum(terms) <= pool.count, ctx.name(key(pool.name)))


def describe(k: ConstraintKey, ctx) -> str:
    pool = next(p for p in ctx.problem.pools if f"pool {p.name}" == k.element)
    return f"{pool.count} {pool.gpu} GPUs in the pool"
