"""Supernode sizing objectives: one module per objective, each exposing ``OBJECTIVE``, an instance
of :class:`SupernodeObjective` whose methods the formulation (``optimizer.supernode.solve``), the
explanation and the report call, so no code outside this folder compares objective names."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from objectives.base import Objective


@dataclass(frozen=True)
class SupernodeObjective(Objective):
    """A supernode objective and its behaviour.

    Attributes:
        secondary: name of the objective of the second lexicographic stage (ties on this one;
            maximised).
        needs_target: the instance must give ``target_sessions``.
        needs_fabric: the instance must give ``supernode.fabric``.

    The model-facing methods take the supernode model (``optimizer.supernode.model.SupernodeModel``:
    ``x`` instances per option, ``cards_used``, ``sessions``), the explanation-facing ones a
    problem and one evaluated option (``optimizer.supernode.perf.OptionResult``).
    """

    secondary: str = "throughput"
    needs_target: bool = False
    needs_fabric: bool = False  # the instance must give ``supernode.fabric`` (the cost objective)

    def needs_built_flags(self) -> bool:
        """The model needs the Booleans ``y_o`` (option o is built) for this objective."""
        return False

    def expr(self, model):
        """The objective in model units (a CP-SAT expression; may add variables to ``model``)."""
        raise NotImplementedError

    def to_unit(self, value: float, model) -> float:
        """A model-unit value in the objective's unit."""
        return int(round(value))

    def metric(self, p, r) -> float:
        """This objective's figure for option ``r`` used alone (higher is better)."""
        raise NotImplementedError

    def metric_text(self, p, r) -> str:
        """:meth:`metric` in words, for the alternatives table."""
        raise NotImplementedError

    def evaluated(self, ev) -> float | None:
        """The independent evaluation's value of a plan (same unit), None when not re-computed."""
        return None


@lru_cache(maxsize=1)
def registry() -> dict[str, SupernodeObjective]:
    """``{name: SupernodeObjective}`` of the supernode objectives (one module each)."""
    from objectives.base import discover

    return discover(__name__)
