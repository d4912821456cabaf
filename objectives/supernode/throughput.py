"""Supernode objective ``throughput``: most decode tokens/s per card given (the default).

Model units: milli-tokens/s of all instances, ``sum_o x_o * round(1000 * S_o * N_o / step_o)``
(resolution 0.001 token/s per instance); reported per card given (divided by ``cards``).
"""
from __future__ import annotations

from dataclasses import dataclass

from objectives.supernode import SupernodeObjective


def coef(r) -> int:
    """Milli-tokens/s of one instance of option ``r``."""
    return int(round(1000 * r.tokens_per_s_instance))


@dataclass(frozen=True)
class MostThroughput(SupernodeObjective):
    def expr(self, model):
        return sum(coef(r) * x for r, x in zip(model.results, model.x))

    def to_unit(self, value: float, model) -> float:
        return value / 1000 / model.problem.cards

    def metric(self, p, r) -> float:
        return r.figures.tokens_per_s_card

    def metric_text(self, p, r) -> str:
        return f"{r.figures.tokens_per_s_card:,.0f} tokens/s per card"

    def evaluated(self, ev) -> float:
        return ev.tokens_per_s_per_card


OBJECTIVE = MostThroughput(
    name="throughput", unit="tokens/s per card", sense="max", default=True, secondary="sessions",
    definition="decode tokens/s of all instances divided by the cards given, tokens/s per card")
