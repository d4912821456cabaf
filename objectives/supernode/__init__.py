"""Supernode sizing objectives: one module per objective (``NAME``, ``SENSE``, ``UNIT``, ``SECONDARY``,
``expr`` or ``add``, ``to_unit``)."""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def registry():
    """``{name: Objective}`` (``.module`` is the objective's module)."""
    from objectives.base import discover

    return discover(__name__)
