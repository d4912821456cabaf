"""Objectives of the deployment problem, one module each (``OBJECTIVE`` in every module)."""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def registry():
    """``{name: DeploymentObjective}`` of every module in this folder."""
    from objectives.base import discover

    return discover(__name__)


def get(objective):
    """The objective object for a name (or the object itself).

    Raises:
        KeyError: unknown name (callers turn it into a one-line input error).
    """
    if isinstance(objective, str):
        return registry()[objective]
    return objective
