"""Objective ``inter-node``: maximise locally served tokens ``sum w[e] * u[e,n] / N``
(equivalently minimise tokens crossing nodes) subject to the max-load cap:

    maximise sum_{e,n} (w[e] / N) u[e,n]      (u: family node_cover)
"""
from __future__ import annotations

from dataclasses import dataclass

from objectives.experts import ExpertsObjective


@dataclass(frozen=True)
class InterNode(ExpertsObjective):
    def set_objective(self, model, T, moves_expr=None, move_weight: int = 0, cover_terms=()) -> None:
        from ortools.sat.python import cp_model

        if cover_terms:
            model.maximize(cp_model.LinearExpr.weighted_sum([v for _, v in cover_terms], [c for c, _ in cover_terms]))

    def lns_score(self, state, gpus: list[int]) -> tuple:
        """(minus the tokens served on their own node)."""
        return (-float((state.t.w[:, None] * state.covered()).sum()),)


OBJECTIVE = InterNode(
    name="inter-node", unit="tokens crossing nodes", covers_nodes=True, summary_key="cross_node_tokens",
    definition="routed tokens (spread evenly over the nodes) whose expert has no copy on their own node, summed "
               "over layers, tokens; subject to the max-load cap")
