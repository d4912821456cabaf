"""Build-out objective ``racks``: the fewest racks holding at least ``target_gpus`` GPUs.

Also the secondary objective of every build-out solve: for the chosen servers use the fewest
racks, preferring air cooling on ties. Lexicographic (racks, liquid racks) as one integer
objective ``racks * (L + 1) + liquid`` with ``L`` an upper bound on the liquid racks: since
``0 <= liquid <= L``, one rack fewer always outweighs any change in liquid racks, so the
weighted optimum is the lexicographic optimum.
"""
from __future__ import annotations

NAME = "racks"
SENSE = "min"
UNIT = "racks"


def expr(ctx):
    return ctx.racks()


def to_unit(value: float, ctx) -> float:
    return int(round(value))


def secondary_expr(ctx):
    """(racks, liquid racks) lexicographically, as one integer; see the module docstring."""
    weight = ctx.racks_ub + 1
    return weight * ctx.racks() + ctx.racks("liquid")
