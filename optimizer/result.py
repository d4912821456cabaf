"""Typed results shared by the three problems (deployment, experts, build-out)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    """Solver outcome. ``FEASIBLE`` means a plan with a non-zero (or unproven) gap."""

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    TIME_LIMIT = "time_limit"  # the limit ran out before any plan was found


@dataclass(frozen=True, order=True)
class ConstraintKey:
    """Structured name of one constraint: its family and the element it ranges over.

    ``str(key)`` is the display name, e.g. ``memory[instance tp2#0@server0]``. Explanations
    and infeasibility reports carry the key itself, so nothing ever parses the string.
    """

    family: str
    element: str

    def __str__(self) -> str:
        return f"{self.family}[{self.element}]"


@dataclass
class SolverStats:
    """What one solve (or a sequence of solves, e.g. Dinkelbach iterations) reports.

    Attributes:
        name: backend, e.g. ``"cp-sat"`` or ``"highs"``.
        status: outcome.
        time_s: wall time of all solver calls, seconds.
        objective: objective value of the reported plan (in the objective's unit), or None.
        bound: best proven bound in the same unit, or None when the backend gave none.
        gap: relative gap ``|objective - bound| / |objective|`` (0 when proven optimal).
        solves: number of solver calls made.
    """

    name: str
    status: Status
    time_s: float
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    solves: int = 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """Relative gap ``|obj - bound| / max(|obj|, 1e-12)``; None if either is missing."""
    if objective is None or bound is None:
        return None
    return abs(objective - bound) / max(abs(objective), 1e-12)


@dataclass
class Binding:
    """A constraint that binds (or nearly binds) at the reported plan.

    Attributes:
        key: structured constraint name.
        slack: how far the plan is from the limit, in ``unit`` (0 = tight).
        unit: unit of ``slack``.
        detail: one sentence a user can read.
    """

    key: ConstraintKey
    slack: float
    unit: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "constraint": str(self.key),
            "family": self.key.family,
            "element": self.key.element,
            "slack": self.slack,
            "unit": self.unit,
            "detail": self.detail,
        }


@dataclass
class Conflict:
    """A set of named constraints that cannot hold together (infeasibility explanation)."""

    keys: list[ConstraintKey] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "constraints": [str(k) for k in self.keys],
            "families": sorted({k.family for k in self.keys}),
            "details": self.details,
        }
