"""Supernode objective ``sessions``: most concurrent sessions on the cards given (``sum_o S_o N_o x_o``)."""
from __future__ import annotations

NAME = "sessions"
SENSE = "max"
UNIT = "sessions"
DEFINITION = "concurrent sessions (sessions per card x cards) of all instances at the instance's context, sessions"
SECONDARY = "throughput"  # the objective of the second stage (ties on this one)


def expr(ctx):
    return ctx.sessions


def to_unit(value: float, ctx) -> float:
    return int(round(value))


def metric(p, r) -> float:
    """This objective's figure for one option used alone (higher is better)."""
    return float(r.sessions_per_card)


def metric_text(p, r) -> str:
    return f"{r.sessions_per_card} sessions per card"
