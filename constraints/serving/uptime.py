"""Day-plan family ``uptime``: a started worker stays up for at least the minimum up-time.

    n_{j,w} >= Σ_{w' <= w, start_w < start_w' + U} s_{j,w'}      for each configuration j, window w

with ``U`` = ``serving.startup.min_uptime_min`` (s) and ``start_w`` the start of window w (s): every
worker started in a window that began less than U before window w began is still up in w. Rows
only where that sum holds an earlier window's starts (``n_{j,w} >= s_{j,w}`` alone follows from
the startup rows). Row ``uptime[window 3, n[aggregated TP4 on h100-sxm]]``.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "uptime"


def key(window: int, label: str) -> ConstraintKey:
    return ConstraintKey(FAMILY, f"window {window + 1}, n[{label}]")


def started_within(data, w: int) -> list[int]:
    """The windows w' <= w whose starts must still be up in window w."""
    u = data.problem.startup.min_uptime_s if data.problem.startup is not None else 0.0
    start = data.windows[w].start_s
    return [v for v in range(w + 1) if start < data.windows[v].start_s + u - 1e-9]


def define(model, data) -> None:
    for w in range(len(data.windows)):
        within = started_within(data, w)
        if not any(v < w for v in within):
            continue
        for j, label in enumerate(data.labels):
            model.add(model.x[j][w] - sum(model.s[j][v] for v in within) >= 0, key(w, label))


def describe(k: ConstraintKey, data) -> str:
    win, n = k.element.split(", ", 1)
    u = data.problem.startup.min_uptime_s / 60.0
    return f"workers {n} started less than {u:g} min before {win} are still up in it"
