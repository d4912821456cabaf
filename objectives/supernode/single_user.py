"""Supernode objective ``single_user``: fastest batch-1 token (eq 6-15) over the instances built.

Model units: nanoseconds (resolution 1 ns, token times rounded up). With ``y_o`` = 1 when
option o is built (``x_o <= cards * y_o``, ``x_o >= y_o``):

    t >= T1_o * y_o   for every option o;   minimise t
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from objectives.supernode import SupernodeObjective


def ns(r) -> int:
    """Batch-1 token time of option ``r``, whole nanoseconds rounded up."""
    return int(math.ceil(r.single.token * 1e9 - 1e-6))


@dataclass(frozen=True)
class FastestSingleUser(SupernodeObjective):
    def needs_built_flags(self) -> bool:
        return True

    def expr(self, model):
        """Adds ``t`` and the links between ``x_o`` and ``y_o``; returns ``t`` (ns)."""
        m = model.cp
        ub = max([ns(r) for r in model.results] + [1])
        t = m.new_int_var(0, ub, "single_user_ns")
        for r, x, y in zip(model.results, model.x, model.y):
            m.add(x <= model.problem.cards * y)
            m.add(x >= y)
            m.add(t >= ns(r) * y)
        return t

    def to_unit(self, value: float, model) -> float:
        return value / 1e6

    def metric(self, p, r) -> float:
        """Minus the batch-1 token time."""
        return -r.single.token

    def metric_text(self, p, r) -> str:
        return f"{r.single.token * 1e3:.3f} ms per batch-1 token"


OBJECTIVE = FastestSingleUser(
    name="single_user", unit="ms per token", sense="min", secondary="throughput",
    definition="fastest batch-1 token time over the instances built (eq 6-15), ms per token")
