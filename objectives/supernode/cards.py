"""Supernode objective ``cards``: fewest cards that hold ``target_sessions`` (``sum_o S_o x_o``)."""
from __future__ import annotations

NAME = "cards"
SENSE = "min"
UNIT = "cards"
DEFINITION = "cards in instances that together hold target_sessions, cards"
SECONDARY = "throughput"  # the objective of the second stage (ties on this one)
NEEDS_TARGET = True  # target_sessions


def expr(ctx):
    return ctx.cards_used


def to_unit(value: float, ctx) -> float:
    return int(round(value))


def metric(p, r) -> float:
    """This objective's figure for one option used alone (higher is better): minus the cards it
    needs for the target."""
    import math

    return -r.option.size * math.ceil(p.target_sessions / r.sessions_instance)


def metric_text(p, r) -> str:
    return f"{-metric(p, r):,.0f} cards for {p.target_sessions:,} sessions"
