"""Build-out family ``max_count``: at most ``max_count`` servers of a type (stock, contract)."""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "max_count"


def add(nm, ctx) -> None:
    for t in ctx.problem.types:
        if t.max_count is not None:
            nm.add(ConstraintKey(FAMILY, t.name), ctx.n[t.name] <= t.max_count)


def describe(key: ConstraintKey, p) -> str:
    return f"at most {p.type(key.element).max_count} {key.element} servers"
