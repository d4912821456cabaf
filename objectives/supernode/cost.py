"""Supernode objective ``cost``: the cheapest build that holds ``target_sessions`` within the
per-token target, cards and fabric together (needs ``supernode.fabric``).

    min  sum_o x_o (S_o x round(card_cost_usd) + round(fabric_cost_o))      USD

with ``fabric_cost_o`` one domain's port links x ``link_cost_usd`` + switch chips x
``switch_cost_usd`` (+ UB per host) (:mod:`optimizer.supernode.fabric`). Every built option
meets ``slo_ms_per_token`` at its sessions per card (the ``slo`` family).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from objectives.supernode import SupernodeObjective


def instance_cost(p, r) -> int:
    """USD of one instance of option ``r``: its cards and its fabric."""
    card = int(round(p.fabric.card_cost_usd)) if p.fabric is not None else 0
    fab = 0 if r.fabric is None else int(round(r.fabric.cost_usd))
    return r.option.size * card + fab


@dataclass(frozen=True)
class LeastCost(SupernodeObjective):
    def expr(self, model):
        p = model.problem
        return sum(instance_cost(p, r) * x for r, x in zip(model.results, model.x))

    def metric(self, p, r) -> float:
        """Minus the cost of the instances of option ``r`` alone that hold the target."""
        return -instance_cost(p, r) * math.ceil(p.target_sessions / r.sessions_instance)

    def metric_text(self, p, r) -> str:
        n = math.ceil(p.target_sessions / r.sessions_instance)
        return f"{-self.metric(p, r):,.0f} USD ({n} instance(s)) for {p.target_sessions:,} sessions"

    def evaluated(self, ev) -> float | None:
        return ev.cost_usd


OBJECTIVE = LeastCost(name="cost", unit="USD", sense="min",
                      definition="cards x card_cost_usd + every built domain's fabric (port links x link_cost_usd "
                                 "+ switch chips x switch_cost_usd, + UB per host) for target_sessions within the "
                                 "per-token target, USD",
                      secondary="throughput", needs_target=True, needs_fabric=True)
