"""Objective ``migration``: fewest expert copies moved (``x[e,g] = 1`` where the previous
placement had no replica of ``e`` on ``g``) subject to the max-load target."""
from __future__ import annotations

from typing import TYPE_CHECKING

from objectives.base import Objective

if TYPE_CHECKING:  # the CLI lists objectives at start-up: no solver import there
    from ortools.sat.python import cp_model


def set_objective(model: cp_model.CpModel, moves_expr) -> None:
    model.minimize(moves_expr)


OBJECTIVE = Objective(name="migration", unit="expert copies moved", default=False,
                      definition="expert copies to load relative to the previous placement, summed over layers; subject to the max-load target")
