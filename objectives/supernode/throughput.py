"""Supernode objective ``throughput``: most decode tokens/s per card given (the default).

Model units: milli-tokens/s of all instances, ``sum_o x_o * round(1000 * S_o * N_o / step_o)``
(resolution 0.001 token/s per instance); reported per card given (divided by ``cards``).
"""
from __future__ import annotations

NAME = "throughput"
SENSE = "max"
UNIT = "tokens/s per card"
DEFINITION = "decode tokens/s of all instances divided by the cards given, tokens/s per card"
SECONDARY = "sessions"  # the objective of the second stage (ties on this one)
DEFAULT = True


def coef(r) -> int:
    return int(round(1000 * r.tokens_per_s_instance))


def expr(ctx):
    return sum(coef(r) * x for r, x in zip(ctx.results, ctx.x))


def to_unit(value: float, ctx) -> float:
    return value / 1000 / ctx.problem.cards


def metric(p, r) -> float:
    """This objective's figure for one option used alone (higher is better)."""
    return r.figures.tokens_per_s_card


def metric_text(p, r) -> str:
    return f"{r.figures.tokens_per_s_card:,.0f} tokens/s per card"


def evaluated(ev) -> float:
    """The independent evaluation's value of a plan (same unit), or None when not re-computed."""
    return ev.tokens_per_s_per_card
