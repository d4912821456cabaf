"""Expert-placement objectives: one module per objective, each exposing ``OBJECTIVE``, an instance
of :class:`ExpertsObjective` whose methods the formulation (``optimizer.experts.model``), the
per-layer search (``optimizer.experts.solve``), the loader and the report call, so no code
outside this folder compares objective names.

Every layer is solved in two phases: the max load first, then (for an objective that is not the
max load itself) that objective under a cap on the max load (:attr:`ExpertsObjective.balances_load`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from objectives.base import Objective


@dataclass(frozen=True)
class ExpertsObjective(Objective):
    """An expert-placement objective and its behaviour.

    Attributes:
        balances_load: the objective is the max load itself (one phase, the busiest-GPU search);
            otherwise a second phase optimises it under the max-load cap.
        covers_nodes: the model needs the node-cover Booleans ``u[e, n]`` (family ``node_cover``).
        needs_previous_placement: the instance must give ``experts.previous_placement``.
        summary_key: the key of the report summary's per-plan figures that holds the objective's
            value (None: the sum of max loads).
    """

    balances_load: bool = False
    covers_nodes: bool = False
    needs_previous_placement: bool = False
    summary_key: str | None = None

    def set_objective(self, model, T, moves_expr=None, move_weight: int = 0, cover_terms=()) -> None:
        """Set the objective on the CP-SAT ``model``.

        Args:
            T: the max-load variable (load units).
            moves_expr: expert copies placed where the previous placement had none (None:
                no previous placement).
            move_weight: load units charged per moved copy.
            cover_terms: ``(weight, u[e, n])`` node-cover terms (when :attr:`covers_nodes`).
        Raises:
            ValueError: the objective needs a previous placement and there is none.
        """
        raise NotImplementedError

    def lns_score(self, state, gpus: list[int]) -> tuple:
        """Score of the search state after re-solving ``gpus`` (smaller is better).

        ``state`` is the per-layer search state of ``optimizer.experts.solve``: ``load`` (GPU
        loads, units), ``moves()``, ``covered()`` ``[experts, nodes]``, ``scale``, and the layer
        task ``t`` (``w``, ``prev``, ``move_weight``).
        """
        raise NotImplementedError

    def starts_from_previous(self) -> bool:
        """The search starts from the previous placement (and keeps it when it meets the cap:
        zero moves, which no plan beats)."""
        return False

    def envelope_value(self, summary: dict, proven: bool) -> tuple[float | None, float | None, float | None]:
        """``(value, bound, gap)`` of the result envelope from the report summary
        (``optimizer.experts.report.ExpertsReport.summary``); ``proven``: every layer is optimal."""
        value = summary["optimized"][self.summary_key]
        # a count of tokens or moves is never below 0: a plan at 0 is its own proof
        proven = proven or value == 0
        return value, (value if proven else None), (0.0 if proven else None)


@lru_cache(maxsize=1)
def registry() -> dict[str, ExpertsObjective]:
    """``{name: ExpertsObjective}`` of the expert-placement objectives (one module each)."""
    from objectives.base import discover

    return discover(__name__)
