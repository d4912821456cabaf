"""Supernode objective ``cards``: fewest cards that hold ``target_sessions`` (``sum_o S_o x_o``)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from objectives.supernode import SupernodeObjective


@dataclass(frozen=True)
class FewestCards(SupernodeObjective):
    def expr(self, model):
        return model.cards_used

    def metric(self, p, r) -> float:
        """Minus the cards option ``r`` needs for the target."""
        return -r.option.size * math.ceil(p.target_sessions / r.sessions_instance)

    def metric_text(self, p, r) -> str:
        return f"{-self.metric(p, r):,.0f} cards for {p.target_sessions:,} sessions"


OBJECTIVE = FewestCards(name="cards", unit="cards", sense="min",
                        definition="cards in instances that together hold target_sessions, cards",
                        secondary="throughput", needs_target=True)
