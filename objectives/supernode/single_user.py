"""Supernode objective ``single_user``: fastest batch-1 token (eq 6-15) over the instances built.

Model units: nanoseconds (resolution 1 ns, token times rounded up). ``t >= T1_o * y_o`` with
``y_o`` = 1 when option o is built, minimise ``t``.
"""
from __future__ import annotations

import math

NAME = "single_user"
SENSE = "min"
UNIT = "ms per token"
DEFINITION = "fastest batch-1 token time over the instances built (eq 6-15), ms per token"
SECONDARY = "throughput"  # the objective of the second stage (ties on this one)
NEEDS_SINGLE_USER_VARS = True  # the model adds y_o and t (see add)


def ns(r) -> int:
    return int(math.ceil(r.single.token * 1e9 - 1e-6))


def add(nm, ctx):
    """Add ``y_o`` and ``t``; returns the objective expression (ns)."""
    m = nm.model
    ub = max([ns(r) for r in ctx.results] + [1])
    t = m.new_int_var(0, ub, "single_user_ns")
    for r, x, y in zip(ctx.results, ctx.x, ctx.y):
        m.add(x <= ctx.problem.cards * y)
        m.add(x >= y)
        m.add(t >= ns(r) * y)
    return t


def to_unit(value: float, ctx) -> float:
    return value / 1e6


def metric(p, r) -> float:
    """This objective's figure for one option used alone (higher is better): minus the token time."""
    return -r.single.token


def metric_text(p, r) -> str:
    return f"{r.single.token * 1e3:.3f} ms per batch-1 token"
