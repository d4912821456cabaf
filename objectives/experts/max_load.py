"""Objective ``max-load``: minimise the busiest GPU's load ``T`` (per layer), plus
``migration_weight`` load units per expert copy moved when a previous placement is given."""
from __future__ import annotations

from typing import TYPE_CHECKING

from objectives.base import Objective

if TYPE_CHECKING:  # the CLI lists objectives at start-up: no solver import there
    from ortools.sat.python import cp_model


def set_objective(model: cp_model.CpModel, T: cp_model.IntVar, moves_expr=None, move_weight: int = 0) -> None:
    if moves_expr is not None and move_weight > 0:
        model.minimize(T + move_weight * moves_expr)
    else:
        model.minimize(T)


OBJECTIVE = Objective(name="max-load", unit="tokens (sum over layers of the busiest GPU's load)", default=True,
                      definition="sum over layers of the busiest GPU's routed-token load on the fitted windows, tokens (plus migration_weight per moved copy when a previous placement is given)")
