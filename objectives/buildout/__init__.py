"""buildout objective families"""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def registry():
    """``{name: Objective}`` of the build-out objectives (``.module`` is each objective's module)."""
    from objectives.base import discover

    return discover(__name__)
