"""Family ``assignment[class c]``: every session is served by exactly one instance.

``Σ_k x[k][c] = n_c`` for each session class c (identical sessions grouped). A class that
fits no instance (memory) leaves the constraint with no variables: it is then stated as
``0 = n_c`` so that the infeasibility explanation can name it.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "assignment"


def element(cls) -> str:
    ids = cls.session_ids
    return ids[0] if len(ids) == 1 else f"{ids[0]}..{ids[-1]}"


def define(f, problem) -> None:
    """Add the family's constraints to the formulation ``f`` of ``problem`` (see the module docstring)."""
    for c in f.classes:
        xs = [x for (k, cc), x in f.x.items() if cc == c.index]
        key = ConstraintKey(FAMILY, element(c))
        if xs:
            f.nm.add(key, sum(xs) == c.count)
        else:
            zero = f.model.new_constant(0)
            f.nm.add(key, zero == c.count)


def describe(key: ConstraintKey, f) -> str:
    return f"{key}: every session must be served by one instance"
