"""Rack build-out sizing under a kW budget (issue 4).

``optimize INSTANCE.yaml`` with a ``buildout:`` section: how many servers of which types fit
a power budget, in how many air- or liquid-cooled racks, with how many leaf and spine switch
chips, installed in whole units; which limit binds and what the next unit would need.

Pipeline: :mod:`.schema` (strict input, unit conversion) -> :mod:`.model` (CP-SAT model,
constraint families in ``constraints/buildout/*.py``) -> :mod:`.solve` (lexicographic
objectives from ``objectives/buildout/*.py``) -> :mod:`.evaluate` (independent check) ->
:mod:`.explain` (binding limits by what-if solves) -> :mod:`.report`.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from optimizer.buildout.evaluate import evaluate
from optimizer.buildout.explain import bindings, conflict_details, leaf_groups
from optimizer.buildout.report import BuildoutReport
from optimizer.buildout.schema import Problem, load
from optimizer.buildout.solve import SolveResult, solve
from optimizer.budget import Budget, ProgressSink
from optimizer.result import Conflict, Status

__all__ = ["run", "load", "solve", "solve_instance", "evaluate_plan", "BuildoutReport"]


def evaluate_plan(p: Problem, res: SolveResult):
    """Evaluate a solver plan with the independent evaluator."""
    plan = res.plan
    racks = [(pat.cooling, {t.name: c for t, c in zip(p.types, pat.counts) if c}, mult,
              pat.counts[len(p.types)] if len(pat.counts) > len(p.types) else 0) for pat, mult in plan["racks"]]
    return evaluate(p, plan["servers"], racks, leaf_groups(p, plan), plan.get("spine", 0))


SOLVE_SHARE = 0.6  # with a time limit: the lexicographic solve's share of the budget, the explanation's what-ifs the rest
MIN_SOLVE_S = 0.25  # the solve gets at least this long, even when start-up has used the budget


def solve_instance(p: Problem, objective: str, time_limit_s: float | None = None,
                   end: float | None = None) -> BuildoutReport:
    """Solve, check the plan independently, explain it; returns the report. With
    ``time_limit_s`` the whole call ends by ``end`` (a ``time.perf_counter()`` value; default
    :meth:`optimizer.budget.Budget.for_command`): the solve gets ``SOLVE_SHARE`` of it, the
    explanation's what-if solves the rest (those skipped are counted in ``cut_short``).

    Raises:
        RuntimeError: the solver's plan fails the independent evaluation (a modelling bug).
    """
    from optimizer.buildout import explain

    if end is None:
        end = Budget.for_command(time_limit_s).deadline
    explain.WHATIF_DEADLINE[0], explain.WHATIF_SKIPPED[0] = end, 0
    try:
        return _solve_and_explain(p, objective, time_limit_s, end)
    finally:
        explain.WHATIF_DEADLINE[0] = None


def _solve_and_explain(p: Problem, objective: str, time_limit_s: float | None, end: float | None) -> BuildoutReport:
    from optimizer.buildout import explain

    if end is not None:
        time_limit_s = max(MIN_SOLVE_S, SOLVE_SHARE * (end - time.perf_counter()))
    res = solve(p, objective, time_limit_s)
    if res.plan is None:
        conflict = None
        achievable = None
        if res.status == Status.INFEASIBLE:
            keys = res.conflict or []
            conflict = Conflict(keys, conflict_details(p, keys) or ["the limits cannot all hold"])
            achievable = most_gpus_without_target(p, time_limit_s if end is None else
                                                  max(MIN_SOLVE_S, end - time.perf_counter()))
        return BuildoutReport(p, res, conflict=conflict, achievable=achievable)
    ev = evaluate_plan(p, res)
    if ev.violations:
        raise RuntimeError(f"build-out plan fails the independent check: {ev.violations}")
    binding = bindings(p, objective, res.value, res.plan, ev)
    out = BuildoutReport(p, res, ev, binding)
    if explain.WHATIF_SKIPPED[0]:
        out.cut_short.append(f"explanation: {explain.WHATIF_SKIPPED[0]} what-if solves skipped (their lines are "
                             f"left out)")
    return out


def most_gpus_without_target(p: Problem, time_limit_s: float | None) -> dict | None:
    """For an infeasible ``target_gpus``: the most GPUs any plan fits within the other limits
    (the ``gpus`` objective without the target), or None when there is no target or no plan; a
    fixed load that takes the whole budget: the budget missing before the first server."""
    if p.fixed_w >= p.budget_w:  # no server at all: the budget is the answer
        short = (p.fixed_w - p.budget_w) / 1e3
        return {"requirement": "power_budget_kw", "best": 0, "required": p.power_budget_kw,
                "detail": f"the fixed load ({p.fixed_power_kw:g} kW) takes the whole {p.power_budget_kw:g} kW budget: "
                          f"no server fits; {short:g} kW more budget covers the fixed load, the first server "
                          f"needs its own power on top"}
    if p.target_gpus is None:
        return None
    best = solve(replace(p, target_gpus=None), "gpus", time_limit_s)
    if best.plan is None or best.value is None:
        return {"requirement": "target_gpus", "best": 0, "required": p.target_gpus,
                "detail": f"no plan holds any GPU within these limits; {p.target_gpus} required"}
    proven = "" if best.status == Status.OPTIMAL else " (not proven: time limit)"
    return {"requirement": "target_gpus", "best": int(best.value), "required": p.target_gpus,
            "detail": f"at most {int(best.value)} GPUs fit these limits{proven}; {p.target_gpus} required"}


def run(raw: dict[str, Any], path: Path, objective: str | None, budget: Budget,
        output_dir: Path | None, progress: ProgressSink | None = None) -> BuildoutReport:
    """CLI entry point (see optimizer/problems.py). ``output_dir`` is unused (no output files).

    The report's time (``solver.time_s`` in JSON, the last table line) is the wall time of this
    whole call: validation, model building, every CP-SAT stage, the independent check and the
    what-if solves of the explanation. Interpreter start-up and imports come before it
    (``benchmarks/bench_buildout.py`` measures the whole command against a bare import).

    Raises:
        InputError: bad input, including an unknown objective.
    """
    t0 = time.perf_counter()
    p, obj = load(raw, path, objective)
    report = solve_instance(p, obj, budget.limit_s, budget.deadline)
    report.total_time_s = time.perf_counter() - t0
    return report
