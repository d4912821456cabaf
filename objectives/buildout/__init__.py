"""Build-out objectives: one module per objective, each exposing ``OBJECTIVE``, an instance of
:class:`BuildoutObjective` whose methods the formulation (``optimizer.buildout.solve``), the
explanation and the report call, so no code outside this folder compares objective names."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from objectives.base import Objective


@dataclass(frozen=True)
class BuildoutObjective(Objective):
    """A build-out objective and its behaviour.

    Attributes:
        needs_target: the instance must give ``target_gpus`` (the cheapest / fewest-racks plan of
            what size); otherwise a given target is a lower bound.
        needs_cost: every server type needs a cost.
        short_unit: how "a better plan" is named in explanations (``GPUs``, ``cost``, ``racks``).
        next_unit_hint: explanations say what the next install unit would need.
        needs_workload: the instance must give ``buildout.workload`` (each type's delivered tokens/s).

    The model-facing methods take the build-out model (``optimizer.buildout.model.BuildoutModel``:
    ``gpus``, ``cost_c``, ``racks()`` as CP-SAT expressions in model units).
    """

    needs_target: bool = False
    needs_cost: bool = False
    short_unit: str = ""
    next_unit_hint: bool = False
    needs_workload: bool = False  # every server type needs its delivered tokens/s (buildout.workload)

    def expr(self, model):
        """The objective in model units (a CP-SAT linear expression)."""
        raise NotImplementedError

    def to_unit(self, value: float, model) -> float:
        """A model-unit value in the objective's unit."""
        return int(round(value))

    def better_than(self, model, value: float):
        """A constraint: a plan strictly better than ``value`` (objective unit)."""
        raise NotImplementedError

    def min_gpus_better_than(self, value: float) -> int:
        """GPUs a plan strictly better than ``value`` must hold at least (a hint for the model build)."""
        return 0

    def unit_for(self, problem) -> str:
        """The unit of the value for this problem (the cost unit comes from the catalog)."""
        return self.unit

    def better(self, new: float | None, old: float) -> bool:
        """True when ``new`` (objective unit, None: no value) is strictly better than ``old``."""
        if new is None:
            return False
        return new > old if self.sense == "max" else new < old - 1e-9


@lru_cache(maxsize=1)
def registry() -> dict[str, BuildoutObjective]:
    """``{name: BuildoutObjective}`` of the build-out objectives (one module each)."""
    from objectives.base import discover

    return discover(__name__)
