"""Objective ``max-load``: minimise the busiest GPU's load ``T`` (per layer), plus
``migration_weight`` load units per expert copy moved when a previous placement is given:

    minimise T + move_weight * moves
"""
from __future__ import annotations

from dataclasses import dataclass

from objectives.experts import ExpertsObjective


@dataclass(frozen=True)
class MaxLoad(ExpertsObjective):
    def set_objective(self, model, T, moves_expr=None, move_weight: int = 0, cover_terms=()) -> None:
        if moves_expr is not None and move_weight > 0:
            model.minimize(T + move_weight * moves_expr)
        else:
            model.minimize(T)

    def lns_score(self, state, gpus: list[int]) -> tuple:
        """(the subset's max load plus the moves' charge, 1 when the subset is empty)."""
        t = state.t
        mv = state.moves() * int(round(t.move_weight * state.scale)) if t.prev is not None else 0
        return (int(state.load[gpus].max()) + mv, int(state.load[gpus].sum() == 0))

    def envelope_value(self, summary: dict, proven: bool):
        return summary["objective_sum_max_load"], summary["bound_sum_max_load"], summary["gap"]


OBJECTIVE = MaxLoad(
    name="max-load", unit="tokens (sum over layers of the busiest GPU's load)", default=True, balances_load=True,
    definition="sum over layers of the busiest GPU's routed-token load on the fitted windows, tokens (plus "
               "migration_weight per moved copy when a previous placement is given)")
