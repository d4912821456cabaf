"""Supernode objective ``cards``: fewest cards that hold ``target_sessions`` (``sum_o S_o x_o``)."""
from __future__ import annotations

NAME = "cards"
SENSE = "min"
UNIT = "cards"
DEFINITION = "cards in instances that together hold target_sessions, cards"
SECONDARY = "throughput"  # the objective of the second stage (ties on this one)


def expr(ctx):
    return ctx.cards_used


def to_unit(value: float, ctx) -> float:
    return int(round(value))
