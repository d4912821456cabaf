"""Day-plan family ``gpus``: in every window the workers up on each pool use at most its GPUs.

    Σ_{j on pool} g_j·n_{j,w} <= count_pool      for each window w, each pool with a configuration

with ``g_j`` the GPUs of one worker of configuration j (a worker still loading its weights holds
them too: it is up). Row ``gpus[window 3, pool h100-sxm]``.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "gpus"


def key(window: int, pool_name: str) -> ConstraintKey:
    return ConstraintKey(FAMILY, f"window {window + 1}, pool {pool_name}")


def define(model, data) -> None:
    for w in range(len(data.windows)):
        for i, pool in enumerate(data.problem.pools):
            on_pool = [data.gpus[j] * model.x[j][w] for j in range(len(data.labels)) if data.pool_of[j] == i]
            if on_pool:
                model.add(sum(on_pool) <= pool.count, key(w, pool.name))


def describe(k: ConstraintKey, data) -> str:
    """``"64 h100-sxm GPUs in the pool in window 3"``.

    Raises:
        StopIteration: ``k`` names no pool of ``data.problem``.
    """
    win, pool_name = k.element.split(", pool ")
    pool = next(p for p in data.problem.pools if p.name == pool_name)
    return f"{pool.count} {pool.gpu} GPUs in the pool in {win}"
