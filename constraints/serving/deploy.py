"""Serving family ``deploy``: every role of the mode has a worker, whatever the rate.

    Σ_{j in role} n_j >= 1            for each role of the mode

(a disaggregated plan needs a prefill and a decode pool even at a rate one worker carries; a
goodput plan needs them before its rate can be positive).
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "deploy"


def key(role: str) -> ConstraintKey:
    return ConstraintKey(FAMILY, role)


def define(model, data) -> None:
    for role in data.roles:
        model.add(sum(x for w, x in zip(data.workers, model.x) if w.role == role) >= 1, key(role))


def describe(k: ConstraintKey, data) -> str:
    return f"at least one {k.element} worker"
