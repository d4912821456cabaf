"""Deployment problem: split GPUs into TP instances, assign and order sessions, minimise
cost / makespan / latency / energy under memory, deadline, on-time and fault limits."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from optimizer.deployment.explain import alternatives, binding, conflict_details
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.report import DeploymentReport
from optimizer.deployment.schema import Problem, build_problem
from optimizer.deployment.solve import OBJECTIVES, conflicts, solve_deployment
from optimizer.errors import InputError
from optimizer.result import ConstraintKey, Status
from optimizer.schema_base import apply_overrides, read_yaml

DEFAULT_OBJECTIVE = "cost"


def load(path, overrides=()) -> Problem:
    """Read, override (``dotted.key=value``) and validate a deployment instance file."""
    path = Path(path)
    raw = apply_overrides(read_yaml(path), list(overrides), path)
    return build_problem(raw, path)


def solve(problem: Problem, objective: str = DEFAULT_OBJECTIVE, time_limit_s: Optional[float] = None,
          explain: bool = True) -> DeploymentReport:
    """Solve and explain a deployment problem.

    Args:
        problem: from :func:`load`.
        objective: cost | makespan | latency | energy.
        time_limit_s: budget for the main solve (default 60 s); explanations get their own
            smaller budget.
        explain: also compute the per-degree comparison and binding constraints.
    Returns:
        DeploymentReport (``status``, ``to_dict()``, ``render(console)``).
    Raises:
        InputError: unknown objective.
    """
    if objective not in OBJECTIVES:
        raise InputError(problem.path, "--objective", f"unknown objective '{objective}' (one of: {', '.join(OBJECTIVES)})")
    t0 = time.perf_counter()
    perf = PerfModel(problem)
    outcome = solve_deployment(problem, objective, time_limit_s, perf=perf)
    report = DeploymentReport(problem, outcome)
    budget = 10.0 if time_limit_s is None else max(1.0, time_limit_s / 2)
    if explain:
        report.alternatives = alternatives(problem, perf, objective, outcome.value, budget)
    if outcome.evaluation is not None and not outcome.evaluation.violations:
        report.binding = binding(problem, perf, outcome.evaluation, objective)
    if outcome.status == Status.INFEASIBLE:
        keys, f = conflicts(problem, perf, objective, budget)
        if not keys:
            rej = [a for a in report.alternatives if a.reason in ("memory", "gpus")]
            if rej and len(rej) == len(report.alternatives):
                keys = [ConstraintKey(a.reason, a.option) for a in rej]
                report.conflict_details = [f"{a.reason}[{a.option}]: {a.detail}" for a in rej]
        else:
            report.conflict_details = conflict_details(problem, perf, keys, f)
        report.conflict_keys = keys
    report.total_time_s = time.perf_counter() - t0
    return report


def run(raw: dict[str, Any], path: Path, objective: Optional[str], time_limit_s: Optional[float],
        output_dir: Optional[Path]) -> DeploymentReport:
    """CLI entry point (see :mod:`optimizer.problems`)."""
    problem = build_problem(raw, path)
    return solve(problem, objective or DEFAULT_OBJECTIVE, time_limit_s)
