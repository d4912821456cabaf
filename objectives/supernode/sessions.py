"""Supernode objective ``sessions``: most concurrent sessions on the cards given (``sum_o S_o N_o x_o``)."""
from __future__ import annotations

from dataclasses import dataclass

from objectives.supernode import SupernodeObjective


@dataclass(frozen=True)
class MostSessions(SupernodeObjective):
    def expr(self, model):
        return model.sessions

    def metric(self, p, r) -> float:
        return float(r.sessions_per_card)

    def metric_text(self, p, r) -> str:
        return f"{r.sessions_per_card} sessions per card"


OBJECTIVE = MostSessions(
    name="sessions", unit="sessions", sense="max", secondary="throughput",
    definition="concurrent sessions (sessions per card x cards) of all instances at the instance's context, sessions")
