"""Serving family ``gpus``: the workers on each pool use at most its GPUs.

    Σ_{j on pool} g_j·n_j <= count_pool       for each pool with a usable configuration

with ``g_j`` the GPUs of one worker of configuration j and ``count_pool`` the pool's GPUs.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "gpus"


def key(pool_name: str) -> ConstraintKey:
    return ConstraintKey(FAMILY, f"pool {pool_name}")


def define(model, data) -> None:
    for i, pool in enumerate(data.problem.pools):
        on_pool = [w.gpus * x for w, x in zip(data.workers, model.x) if w.pool == i]
        if on_pool:
            model.add(sum(on_pool) <= pool.count, key(pool.name))


def describe(k: ConstraintKey, data) -> str:
    """``"64 h100-sxm GPUs in the pool"``.

    Raises:
        StopIteration: ``k`` names no pool of ``data.problem``.
    """
    pool = next(p for p in data.problem.pools if key(p.name) == k)
    return f"{pool.count} {pool.gpu} GPUs in the pool"
