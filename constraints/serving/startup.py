"""Day-plan family ``startup``: a worker up in window w and not in window w-1 was started in w.

    s_{j,w} >= n_{j,w} - n_{j,w-1}      for each configuration j, each window w (n_{j,-1} = 0)

with ``s_{j,w}`` the workers of configuration j started at the start of window w (integer >= 0).
The day starts cold (no worker up before window 1), so window 1's workers are all started. Each
start costs ``g_j·load_j/3600`` GPU-hours (``load_j`` s: ``serving.startup``, loading the weights
with the GPUs held and not serving; :mod:`optimizer.serving.windows`); stopping a worker is free.
Row ``startup[window 3, n[aggregated TP4 on h100-sxm]]``.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "startup"


def key(window: int, label: str) -> ConstraintKey:
    return ConstraintKey(FAMILY, f"window {window + 1}, n[{label}]")


def define(model, data) -> None:
    for j, label in enumerate(data.labels):
        for w in range(len(data.windows)):
            before = model.x[j][w - 1] if w > 0 else 0
            model.add(model.s[j][w] - model.x[j][w] + before >= 0, key(w, label))


def describe(k: ConstraintKey, data) -> str:
    win, n = k.element.split(", ", 1)
    return f"workers {n} added in {win} are started (and pay their load time)"
