"""Supernode family ``deploy``: at least one instance is built (``sum_o x_o >= 1``)."""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "deploy"
KEY = ConstraintKey(FAMILY, "at least one instance")


def add(nm, ctx) -> None:
    nm.add(KEY, sum(ctx.x) >= 1)


def describe(key: ConstraintKey, p) -> str:
    return "at least one instance must be built"
