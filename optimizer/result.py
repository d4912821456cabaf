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
    NOT_FOUND = "not_found"  # a heuristic search found no plan: no proof that none exists (serving closed loop)
    ESTIMATED = "estimated"  # a fixed plan timed and simulated, not searched (optimize estimate)


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


# ---------------------------------------------------------------------------- envelope

ENVELOPE_KEYS = ("problem", "name", "status", "objective", "plan", "binding", "alternatives", "conflicts",
                 "definitions", "solver")

COMMON_DEFINITIONS = {
    "objective.value": "the objective of the returned plan, re-computed by the independent evaluator, in objective.unit",
    "objective.bound": "a proven bound on the best possible objective (lower for min, upper for max), same unit",
    "objective.gap": "relative gap |value - bound| / |value|; 0 when the plan is proven optimal",
    "solver.time_s": "wall time of the run inside the command (solves, explanations, comparison rows), after "
                     "Python start-up and imports, seconds",
    "binding": "limits that bind (or nearly) at the plan, tightest first, with their slack in its unit",
    "alternatives": "options the solver could have chosen and why each lost (a worse objective, or the limit that rules it out)",
    "conflicts": "when no plan exists: groups of named constraints (family[element]) that cannot hold together",
}


def group_conflicts(keys, details_by_key: dict | None = None) -> list[dict[str, Any]]:
    """Group conflicting constraint keys by family: one entry per family with its elements
    and count, so 15 ``deadline[...]`` keys read as one line.

    Args:
        keys: :class:`ConstraintKey` list (a conflict set).
        details_by_key: optional ``{key: sentence}``; the first sentence of a family is kept.
    Returns:
        ``[{"family", "count", "constraints": [...], "detail"}]`` in first-seen family order.
    """
    groups: dict[str, dict[str, Any]] = {}
    for k in keys:
        g = groups.setdefault(k.family, {"family": k.family, "count": 0, "constraints": [], "detail": ""})
        g["count"] += 1
        g["constraints"].append(str(k))
        if details_by_key and not g["detail"] and details_by_key.get(k):
            g["detail"] = details_by_key[k]
    return list(groups.values())


def envelope(problem: str, name: str, status: Status, objective: dict[str, Any] | None, plan: Any,
             solver: dict[str, Any], *, binding: list | None = None, alternatives: list | None = None,
             conflicts: list | None = None, definitions: dict[str, str] | None = None,
             **extra: Any) -> dict[str, Any]:
    """The one JSON result every problem returns (``optimizer/schemas/result.schema.json`` describes it).

    Args:
        problem: problem section name (``deployment``, ``experts``, ``buildout``, ...).
        name: instance name.
        status: solver outcome.
        objective: ``{name, value, unit, bound, gap, definition, sense}`` (None when there is none).
        plan: the problem's plan (a mapping), None when there is none.
        solver: ``{name, status, time_s, gap, ...}``.
        binding, alternatives, conflicts: lists (empty when not applicable).
        definitions: figure name -> definition with unit; the common ones are added.
        extra: problem-specific top-level fields (e.g. ``achievable``, ``notes``, ``files``).
    """
    out: dict[str, Any] = {
        "problem": problem,
        "name": name,
        "status": status.value,
        "objective": objective,
        "plan": plan,
        "binding": binding or [],
        "alternatives": alternatives or [],
        "conflicts": conflicts or [],
        "definitions": {**COMMON_DEFINITIONS, **(definitions or {})},
        "solver": solver,
    }
    out.update({k: v for k, v in extra.items() if v is not None})
    return out


def print_no_plan(console, conflict: "Conflict | None", achievable: dict | None) -> None:
    """The head of an answer without a plan (tables): no plan meets the limits, the best
    achievable value of what failed, and the conflicting constraints; or the time limit ran out."""
    from rich.markup import escape

    if conflict is None:
        console.print("[red]No plan found within the time limit.[/red]")
        return
    console.print("[red]No plan meets all limits.[/red]")
    if achievable:
        console.print(f"[bold]best achievable[/bold]: {escape(achievable['detail'])}")
    console.print("Conflicting constraints:")
    for line in conflict.details:
        console.print(f"  - {escape(line)}")
