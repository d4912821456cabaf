"""Deployment problem API: load, solve (with explanations) and the CLI entry point; minimise
cost / makespan / latency / energy under memory, deadline, on-time and fault limits."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from optimizer.budget import Budget
from optimizer.deployment.explain import explain_infeasible  # noqa: F401 (public)
from optimizer.deployment.pipeline import DEFAULT_OBJECTIVE, PIPELINE, DeploymentData
from optimizer.deployment.report import DeploymentReport
from optimizer.deployment.schema import Problem, build_problem
from optimizer.deployment.settings import SolverSettings
from optimizer.schema_base import apply_overrides, read_yaml

DEFAULT_TIME_LIMIT_S = SolverSettings().default_time_limit_s


def load(path, overrides=()) -> Problem:
    """Read, override (``dotted.key=value``) and validate a deployment instance file."""
    path = Path(path)
    raw = apply_overrides(read_yaml(path), list(overrides), path)
    return build_problem(raw, path)


def solve(problem: Problem, objective=DEFAULT_OBJECTIVE, time_limit_s: Optional[float] = None,
          explain: bool = True, budget: Optional[Budget] = None, progress=None,
          settings: Optional[SolverSettings] = None) -> DeploymentReport:
    """Solve and explain a deployment problem.

    Args:
        problem: from :func:`load`.
        objective: a name from ``objectives/deployment/`` (cost, dollars, gpus, makespan, latency,
            energy) or the objective object.
        time_limit_s: wall-clock budget of the whole call, explanations included (default:
            60 s for the main solve, then 1.5x its time, within 2-10 s, for explanations). With a
            limit T the budget is 92% of T less 0.4 s and 15 µs per session for the output, counted from ``budget.start`` (the CLI's
            start) when a budget is given; the main solve gets 60% of it (85% above 60 sessions) and the comparison rows and conflict
            explanation share the rest; parts cut short are listed in ``cut_short``.
        explain: also compute the per-degree comparison and binding constraints.
        budget: the command's budget (:class:`~optimizer.budget.Budget`); its limit replaces
            ``time_limit_s`` and its start counts the CLI's reading too.
        progress: a sink for ``--progress`` rows (see :data:`optimizer.budget.ProgressSink`).
        settings: shares and tuning constants of the strategy (default :class:`SolverSettings`).
    Returns:
        DeploymentReport (``status``, ``to_dict()``, ``render(console)``).
    Raises:
        InputError: unknown objective, or an input it needs is missing.
    """
    data = DeploymentData(problem, objective)
    solution = PIPELINE.solve(data, budget, progress, time_limit_s=time_limit_s, compare=explain, settings=settings)
    return PIPELINE.report(data, solution, PIPELINE.explain(data, solution, solution.budget))



