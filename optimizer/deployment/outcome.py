"""What a deployment solve returns (:class:`SolveOutcome`) and the objective it is for."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from objectives.deployment import get as get_objective
from objectives.deployment import registry as objective_registry
from objectives.deployment.base import DeploymentObjective
from optimizer.deployment.evaluate import Evaluation
from optimizer.deployment.schema import Problem
from optimizer.errors import InputError
from optimizer.result import SolverStats, Status, relative_gap


def resolve_objective(problem: Problem, objective) -> DeploymentObjective:
    """The objective object for ``objective`` (a name or an object), checked against the problem.

    Raises:
        InputError: unknown name, or an input the objective needs is missing (e.g. a GPU price).
    """
    try:
        obj = get_objective(objective)
    except KeyError:
        raise InputError(problem.path, "--objective", f"unknown objective '{objective}' "
                         f"(one of: {', '.join(objective_registry())})") from None
    obj.check(problem)
    return obj


@dataclass
class SolveOutcome:
    """What :func:`solve_deployment` returns.

    Attributes:
        status: optimal / feasible (gap) / infeasible / time_limit.
        objective: the objective object (``.name``, ``.unit``, ``.definition``).
        value: objective of the plan, re-computed by the evaluator (objective's unit).
        bound: proven bound in the same unit (None if unknown).
        evaluation: evaluator's re-check of the plan (None without a plan).
        stats: solver statistics.
        degrees: TP degrees the plan was allowed to use.
        mode: formulation used (aggregate / sequence / configuration / ordered columns).
        notes: sentences for the reader (which phase found the plan, what was proven).
        method: the solve method that produced the plan (a name of
            :mod:`optimizer.deployment.methods`, with the formulation or phase in brackets).
        bound_method: the method (and algorithm) that proved the bound, or the infeasibility.
        scope: the restriction of the decision space that ``optimal`` / ``infeasible`` are
            claimed under ("" = the whole space the docs state), e.g. earliest-deadline
            admission in replicas too large for the exact order search.
    """

    status: Status
    objective: DeploymentObjective
    value: Optional[float]
    bound: Optional[float]
    evaluation: Optional[Evaluation]
    stats: SolverStats
    degrees: tuple[int, ...]
    mode: str
    notes: list[str] = field(default_factory=list)
    method: str = ""
    bound_method: str = ""
    scope: str = ""


def finish(status, objective, value, bound, ev, stats, allowed, mode) -> SolveOutcome:
    """The outcome of a plan ``ev`` of ``value`` with proven ``bound``: optimal when the bound
    meets the value (to 1e-9 relative), the gap otherwise; an evaluator violation is a note."""
    if status == Status.FEASIBLE and value is not None and bound is not None and bound >= value * (1 - 1e-9):
        status = Status.OPTIMAL  # the proven bound meets the plan (to rounding)
        bound = min(bound, value)
    stats.status = status
    stats.objective = value
    stats.bound = bound
    stats.gap = 0.0 if status == Status.OPTIMAL else relative_gap(value, bound)
    notes = []
    if ev.violations:
        notes.append("evaluator re-check failed: " + "; ".join(ev.violations))
    return SolveOutcome(status, objective, value, bound, ev, stats, allowed, mode, notes)
