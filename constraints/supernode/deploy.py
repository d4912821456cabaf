"""Supernode family ``deploy``: at least one instance is built (``sum_o x_o >= 1``)."""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "deploy"
KEY_FAMILIES = (FAMILY,)
KEY = ConstraintKey(FAMILY, "at least one instance")


def define(model, p) -> None:
    model.add(KEY, sum(model.x) >= 1)


def describe(key: ConstraintKey, p) -> str:
    return "at least one instance must be built"
