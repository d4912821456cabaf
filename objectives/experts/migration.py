"""Objective ``migration``: fewest expert copies moved (``x[e,g] = 1`` where the previous
placement had no replica of ``e`` on ``g``) subject to the max-load target:

    minimise sum_{(e,g): prev[e,g] = 0} x[e,g]
"""
from __future__ import annotations

from dataclasses import dataclass

from objectives.experts import ExpertsObjective


@dataclass(frozen=True)
class Migration(ExpertsObjective):
    def set_objective(self, model, T, moves_expr=None, move_weight: int = 0, cover_terms=()) -> None:
        if moves_expr is None:
            raise ValueError("migration objective needs a previous placement")
        model.minimize(moves_expr)

    def lns_score(self, state, gpus: list[int]) -> tuple:
        """(expert copies moved)."""
        return (state.moves(),)

    def starts_from_previous(self) -> bool:
        return True


OBJECTIVE = Migration(
    name="migration", unit="expert copies moved", needs_previous_placement=True, summary_key="moves",
    definition="expert copies to load relative to the previous placement, summed over layers; subject to the "
               "max-load target")
