"""Build-out family ``max_count``: at most ``max_count`` servers of a type (stock, contract).

    n[t] <= max_count[t]      max_count[<type>], every type with a max_count
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "max_count"


def define(model, p) -> None:
    for t in p.types:
        if t.max_count is not None:
            model.add(ConstraintKey(FAMILY, t.name), model.n[t.name] <= t.max_count)


def describe(key: ConstraintKey, p) -> str:
    return f"at most {p.type(key.element).max_count} {key.element} servers"
