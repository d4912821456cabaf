"""Family ``makespan``: every instance finishes by the makespan M.

``makespan[k]: W_k ≤ M`` where ``W_k`` is the instance's total service time; plus the
redundant work bound ``Σ_k p_k · W_k ≤ (G · servers) · M`` (all GPU·time fits in the
billed GPU·time), which tightens the LP relaxation CP-SAT uses for its bound.
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "makespan"


def define(f, problem) -> None:
    """Add the family's constraints to the formulation ``f`` of ``problem`` (see the module docstring)."""
    for k in f.slots:
        f.nm.add(ConstraintKey(FAMILY, k.label), f.W[k.index] <= f.M)
    if f.slots:
        f.model.add(sum(k.degree * f.W[k.index] for k in f.slots) <= f.problem.total_gpus * f.M)


def describe(key: ConstraintKey, f) -> str:
    return str(key)
