"""Serving objectives: one module per objective, each exposing ``OBJECTIVE`` (a
:class:`ServingObjective`, found by :func:`objectives.base.discover`) whose ``expr(model)`` is the
HiGHS (highspy) linear expression over one mode's MILP (:class:`optimizer.serving.solve.ServingMilp`):
its worker counts ``model.x``, and ``model.rate`` for goodput."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from objectives.base import Objective


@dataclass(frozen=True)
class ServingObjective(Objective):
    """An objective with its expression builder ``expr(model) -> highspy linear expression``."""

    expr: Callable = None  # type: ignore[assignment]


def registry() -> dict[str, ServingObjective]:
    from objectives.base import discover

    return discover("objectives.serving")
