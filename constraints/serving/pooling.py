"""Serving family ``pooling``: prefill workers of one configuration share one prompt queue, so
``n`` of them carry ``n·r(n)`` requests/s with ``r(n)`` non-decreasing (M/G/(n·c) against n
separate M/G/c queues, :attr:`optimizer.serving.perf.Worker.pooling`).

For a prefill configuration j with breakpoints ``1 = n_1 < n_2 < ... < n_K`` and per-worker rates
``r_1 <= ... <= r_K``, segment k covers ``n_k <= n < n_{k+1}`` (the last one up to the workers
its pool holds, ``N_j``):

    n_j = Σ_k u_jk,    n_k·y_jk <= u_jk <= (n_{k+1} - 1)·y_jk,    Σ_k y_jk <= 1,    y binary

and the configuration carries ``Σ_k r_k·u_jk`` requests/s (used by ``capacity`` and
``simulated`` through :func:`carried`). Between breakpoints this is the rate of the lower one, a
lower bound on the pooled rate; configurations without a pooling gain carry ``r_j·n_j`` as
before. Rows are named ``pooling[<configuration>]`` (the count link) and
``pooling[<configuration>, one segment]``.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "pooling"


def key(label: str, part: str = "") -> ConstraintKey:
    return ConstraintKey(FAMILY, f"{label}, {part}" if part else label)


def define(model, data) -> None:
    p = data.problem
    model.carried = {}
    for i, (w, x) in enumerate(zip(data.workers, model.x)):
        if not w.pooling:
            continue
        label = w.label(p)
        top = max(1, p.pools[w.pool].count // w.gpus)
        bps = [(nk, rk) for nk, rk in w.pooling if nk <= top]
        us, ys = [], []
        for k, (nk, rk) in enumerate(bps):
            hi = (bps[k + 1][0] - 1) if k + 1 < len(bps) else top
            y = model.h.addBinary(name=f"y[{label}, {nk}]")
            u = model.h.addIntegral(lb=0, ub=hi, name=f"u[{label}, {nk}]")
            model.add(u >= nk * y, key(label, f"segment {nk} low"))
            model.add(u <= hi * y, key(label, f"segment {nk} high"))
            us.append(u)
            ys.append(y)
        model.add(x == sum(us), key(label))
        model.add(sum(ys) <= 1, key(label, "one segment"))
        model.carried[i] = sum(rk * u for (nk, rk), u in zip(bps, us))


def carried(model, data, role: str):
    """Requests/s the workers of ``role`` carry: pooled segments where :func:`define` made them,
    else ``r_j·n_j``."""
    got = getattr(model, "carried", {})
    return sum(got[i] if i in got else w.rate * x
               for i, (w, x) in enumerate(zip(data.workers, model.x)) if w.role == role)


def describe(k: ConstraintKey, data) -> str:
    return (f"{k.element}: the prefill workers of one configuration share one prompt queue; their count "
            f"picks the pooled rate per worker")
