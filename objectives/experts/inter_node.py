"""Objective ``inter-node``: maximise locally served tokens ``sum w[e] * u[e,n] / N``
(equivalently minimise tokens crossing nodes) subject to the max-load cap."""
from __future__ import annotations

from typing import TYPE_CHECKING

from objectives.base import Objective

if TYPE_CHECKING:  # the CLI lists objectives at start-up: no solver import there
    from ortools.sat.python import cp_model


def set_objective(model: cp_model.CpModel, cover_terms: list[tuple[int, cp_model.IntVar]]) -> None:
    from ortools.sat.python import cp_model

    if cover_terms:
        model.maximize(cp_model.LinearExpr.weighted_sum([v for _, v in cover_terms], [c for c, _ in cover_terms]))


OBJECTIVE = Objective(name="inter-node", unit="tokens crossing nodes", default=False,
                      definition="routed tokens (spread evenly over the nodes) whose expert has no copy on their own node, summed over layers, tokens; subject to the max-load cap")
