"""Day-plan family ``static``: the static plan the day plan is compared with keeps one set of
workers all day.

    n_{j,w} = n_{j,1}      for each configuration j, each window w >= 2

With the ``capacity`` rows of every window this is the cheapest static plan that carries each
window's (margined) rate, i.e. one sized for the peak window under every window's lengths mix.
Row ``static[window 3, n[aggregated TP4 on h100-sxm]]``.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "static"


def key(window: int, label: str) -> ConstraintKey:
    return ConstraintKey(FAMILY, f"window {window + 1}, n[{label}]")


def define(model, data) -> None:
    if not data.static:
        return
    for j, label in enumerate(data.labels):
        for w in range(1, len(data.windows)):
            model.add(model.x[j][w] - model.x[j][0] == 0, key(w, label))


def describe(k: ConstraintKey, data) -> str:
    win, n = k.element.split(", ", 1)
    return f"workers {n} in {win} as in window 1 (static plan)"
