"""Day-plan family ``capacity``: in every window the workers of each role carry that window's rate.

    Σ_{j in role} r_{j,w}·n_{j,w} >= R_w·m_w      for each window w with R_w > 0, each role of the mode

with ``n_{j,w}`` the workers of configuration j up in window w (integer >= 0), ``r_{j,w}`` the
largest rate one worker of j sustains within the SLOs under window w's lengths mix (req/s,
:mod:`optimizer.serving.perf` on that window's traffic), ``R_w`` the window's rate (req/s) and
``m_w >= 1`` its capacity margin (1 until a simulation of the window misses the attainment target,
then raised: the cut of :mod:`optimizer.serving.dayplan`). Row ``capacity[window 3, decode]``.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "capacity"


def key(window: int, role: str) -> ConstraintKey:
    """``window``: 0-based index (the name says ``window index + 1``)."""
    return ConstraintKey(FAMILY, f"window {window + 1}, {role}")


def define(model, data) -> None:
    for w, win in enumerate(data.windows):
        if win.rate <= 0:
            continue
        for role in data.roles:
            carried = [data.rates[j][w] * model.x[j][w] for j in range(len(data.labels))
                       if data.roles_of[j] == role and data.rates[j][w] > 0]
            model.add(sum(carried) >= data.required[w], key(w, role))


def describe(k: ConstraintKey, data) -> str:
    w = int(k.element.split(",")[0].split()[1]) - 1
    role = k.element.split(", ")[1]
    return f"{role} workers in window {w + 1} must carry {data.required[w]:g} requests/s within the SLOs"
