"""Supernode family ``cards``: the instances use at most the cards given.

    sum_o S_o x_o <= cards

with ``x_o`` the number of instances built as option o (S_o cards each).
"""
from __future__ import annotations

from optimizer.result import ConstraintKey

FAMILY = "cards"
KEY_FAMILIES = (FAMILY,)
KEY = ConstraintKey(FAMILY, "total")


def define(model, p) -> None:
    model.add(KEY, model.cards_used <= p.cards)


def describe(key: ConstraintKey, p) -> str:
    return f"{p.cards} cards given"
