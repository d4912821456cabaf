"""Serving objectives: one module per objective, each exposing ``OBJECTIVE`` (a
:class:`ServingObjective`, found by :func:`objectives.base.discover`) whose ``expr(ctx)`` is the
PuLP expression over the worker counts ``ctx.x`` (and ``ctx.rate`` for goodput)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from objectives.base import Objective


@dataclass(frozen=True)
class ServingObjective(Objective):
    """An objective with its PuLP expression builder ``expr(ctx)``."""

    expr: Callable = None  # type: ignore[assignment]


def registry() -> dict[str, ServingObjective]:
    from objectives.base import discover

    return discover("objectives.serving")
