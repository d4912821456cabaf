"""Supernode sizing (reference chapter, section 6.7.4): how many cards each instance's scale-up
domain spans, where read-only lookup tables (Engram) and the KV live among HBM, host memory, a
memory pool, ROM and SRAM, and what that does to sessions per card, step time, tokens/s per
card and single-user speed.

Pipeline: :mod:`.schema` (strict input, units) -> :mod:`.perf` (pure model: every option's
best batch and figures) -> :mod:`.model` (CP-SAT, families in ``constraints/supernode/``) ->
:mod:`.solve` (lexicographic, objectives in ``objectives/supernode/``) -> :mod:`.evaluate`
(independent scalar re-check) -> :mod:`.explain` -> :mod:`.report` (result envelope).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from optimizer.budget import Budget, ProgressSink
from optimizer.result import Conflict, Status
from optimizer.supernode.evaluate import evaluate
from optimizer.supernode.explain import alternatives, bindings, conflict_details, flip_thresholds
from optimizer.supernode.report import SupernodeReport
from optimizer.supernode.schema import Problem, load
from optimizer.supernode.solve import OBJECTIVE_MODULES, SolveResult, solve

__all__ = ["run", "load", "solve", "solve_instance", "evaluate_plan", "SupernodeReport"]


def evaluate_plan(p: Problem, res: SolveResult):
    """Re-check a solver plan with the independent evaluator."""
    plan = []
    for j, count in sorted(res.plan.items()):
        r = res.results[j]
        o = r.option
        plan.append((o.size, o.fabric, o.tables, o.kv, r.sessions_per_card, count))
    return evaluate(p, plan)


def achievable(p: Problem, res) -> dict | None:
    """For an infeasible run: the best any option reaches on what failed — the sessions all the
    cards can hold within the per-token target (with ``target_sessions``), else the fastest batch-1
    token any option has against the target."""
    built = [r for r in res.results if r.feasible and r.sessions_per_card > 0]
    if built and p.target_sessions is not None:
        most = max(r.sessions_per_card * p.cards for r in built)
        return {"requirement": "target_sessions", "best": most, "required": p.target_sessions,
                "detail": f"at most {most:,} sessions fit the {p.cards} cards within the limits; "
                          f"{p.target_sessions:,} required"}
    if not res.results:
        return None
    # among the options the target alone rules out (an option short of memory is no answer: a
    # fresh user was pointed to one 21 GB short)
    buildable = [r for r in res.results if set(r.violations) <= {"slo"}]
    if not buildable:
        return {"requirement": "options", "best": None, "required": None,
                "detail": "no option fits memory and the other limits even with one session per card"}
    fastest = min(buildable, key=lambda r: r.single.token)
    t = fastest.single.token * 1e3
    return {"requirement": "slo_ms_per_token", "best": t, "required": p.slo_s * 1e3,
            "detail": f"the fastest option that fits ({fastest.option.label(p)}) needs {t:.3f} ms per token even at "
                      f"batch 1" + (f" > {p.slo_s * 1e3:g} ms target" if t > p.slo_s * 1e3 else
                                    f"; no option fits memory and the {p.slo_s * 1e3:g} ms target with a session")}


def solve_instance(p: Problem, objective: str | None = None, time_limit_s: float | None = None,
                   thresholds: bool = True) -> SupernodeReport:
    """Solve, re-check the plan independently, explain it; returns the report.

    Raises:
        RuntimeError: the plan fails the independent check, or its objective disagrees with
            the re-computed one (a modelling bug).
    """
    objective = objective or p.objective
    res = solve(p, objective, time_limit_s)
    if res.plan is None:
        conflict = None
        if res.status == Status.INFEASIBLE:
            keys = res.conflict or []
            conflict = Conflict(keys, conflict_details(p, keys, res.results) or ["the limits cannot all hold"])
        return SupernodeReport(p, res, conflict=conflict, achievable=achievable(p, res))
    ev = evaluate_plan(p, res)
    if ev.violations:
        raise RuntimeError(f"supernode plan fails the independent check: {ev.violations}")
    recheck = getattr(OBJECTIVE_MODULES[objective], "evaluated", None)
    if recheck is not None and abs(recheck(ev) - res.value) > 1e-3 * max(1.0, res.value):
        raise RuntimeError(f"{objective} {res.value} disagrees with the re-check {recheck(ev)}")
    rep = SupernodeReport(p, res, ev, bindings(p, res, ev), alternatives(p, res))
    if thresholds:
        budget = 8.0 if time_limit_s is None else max(0.5, min(8.0, time_limit_s))
        rep.thresholds = flip_thresholds(p, res, budget_s=budget)
    return rep


def run(raw: dict[str, Any], path: Path, objective: str | None, budget: Budget,
        output_dir: Path | None, progress: ProgressSink | None = None) -> SupernodeReport:
    """CLI entry point (see optimizer/problems.py). ``output_dir`` is unused (result.json only).

    Raises:
        InputError: bad input, including an unknown objective.
    """
    p = load(raw, path, objective)
    return solve_instance(p, p.objective, budget.limit_s)
