"""Day-plan family ``deploy``: every window with traffic has a worker of each role that can serve it.

    Σ_{j in role, r_{j,w} > 0} n_{j,w} >= 1      for each window w with R_w > 0, each role of the mode

(a disaggregated window needs a prefill and a decode worker even when one worker carries its rate;
a window without requests needs none). Row ``deploy[window 3, prefill]``.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "deploy"


def key(window: int, role: str) -> ConstraintKey:
    return ConstraintKey(FAMILY, f"window {window + 1}, {role}")


def define(model, data) -> None:
    for w, win in enumerate(data.windows):
        if win.rate <= 0:
            continue
        for role in data.roles:
            up = [model.x[j][w] for j in range(len(data.labels)) if data.roles_of[j] == role and data.rates[j][w] > 0]
            model.add(sum(up) >= 1, key(w, role))


def describe(k: ConstraintKey, data) -> str:
    return f"at least one {k.element.split(', ')[1]} worker in {k.element.split(',')[0]}"
