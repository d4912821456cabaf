"""The deployment solve strategy: the registered methods run in turn over one context.

    for each main method (methods.MAIN):   applies(ctx)? -> run(ctx, budget(ctx)) -> keep the better
    final --progress row
    for each method after (methods.AFTER): the same, with the explanation's time

The strategy keeps the best plan and the best bound any method returned and records which
method produced each (``SolveOutcome.method`` / ``bound_method``, the JSON
``solver.method`` / ``solver.bound_method``). "Optimal" means the bound of a method whose
bound holds over the whole decision space meets the plan; "infeasible" means a method proved
that no plan exists. The methods themselves live in :mod:`optimizer.deployment.methods`.
"""
from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Optional

from optimizer.budget import Budget
from optimizer.deployment import methods
from optimizer.deployment.context import SolveContext
from optimizer.deployment.outcome import SolveOutcome, resolve_objective
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.progress import Progress
from optimizer.deployment.schema import Problem
from optimizer.deployment.settings import SolverSettings
from optimizer.result import Status, relative_gap


def _has_plan(o: Optional[SolveOutcome]) -> bool:
    return o is not None and o.evaluation is not None and o.value is not None and math.isfinite(o.value)


def better_of(cur: Optional[SolveOutcome], new: SolveOutcome, sense: str) -> SolveOutcome:
    """The outcome to keep: the better plan (``sense`` ``min``/``max``), with the tighter of the
    two bounds; without plans, a proof of infeasibility over running out of time."""
    if cur is None:
        return new
    sign = -1.0 if sense == "max" else 1.0
    if _has_plan(new) and (not _has_plan(cur) or sign * new.value < sign * cur.value - 1e-9 * max(1.0, abs(cur.value))):
        keep, other = new, cur
    elif _has_plan(cur):
        keep, other = cur, new
    else:
        return new if new.status == Status.INFEASIBLE or cur.status != Status.INFEASIBLE else cur
    if other.bound is None or not _has_plan(keep):
        return keep
    if keep.bound is not None and sign * other.bound <= sign * keep.bound:
        return keep
    bound = other.bound if sign * other.bound <= sign * keep.value else keep.value
    status = Status.OPTIMAL if sign * bound >= sign * keep.value * (1 - 1e-9) else Status.FEASIBLE
    stats = replace(keep.stats, status=status, bound=bound,
                    gap=0.0 if status == Status.OPTIMAL else relative_gap(keep.value, bound))
    return replace(keep, status=status, bound=bound, stats=stats, bound_method=other.bound_method)


def _label(out: SolveOutcome, method) -> None:
    """Name the method behind an outcome's plan and bound where the method did not."""
    detail = out.stats.name
    if not out.method and out.evaluation is not None:
        out.method = f"{method.name} ({detail})"
    if not out.bound_method and (out.bound is not None or out.status == Status.INFEASIBLE):
        out.bound_method = f"{method.name} ({detail})"


def run_methods(ctx: SolveContext, chosen) -> None:
    """Run each method of ``chosen`` that applies, keeping the better outcome in ``ctx.outcome``."""
    sense = ctx.objective.sense
    for m in chosen:
        if not m.applies(ctx):
            continue
        t = time.perf_counter()
        out = m.run(ctx, m.budget(ctx))
        ctx.ran.append((m.name, None if out is None else out.status.value, time.perf_counter() - t))
        if out is not None:
            _label(out, m)
            ctx.outcome = better_of(ctx.outcome, out, sense)
            ctx.progress.report(out.method or m.name, out.value, out.bound)


def solve(ctx: SolveContext) -> SolveOutcome:
    """The main methods, then (``ctx.compare``) the methods after them; returns ``ctx.outcome``.

    Raises:
        RuntimeError: no method returned an outcome (the exact formulations always do).
    """
    ctx.solve_restricted = lambda seconds, degrees=None, layouts=None: solve_deployment(
        ctx.problem, ctx.objective, seconds, degrees=degrees, perf=ctx.perf, layouts=layouts,
        anytime=ctx.anytime, progress=ctx.progress.muted(), settings=ctx.settings)
    run_methods(ctx, methods.load(methods.MAIN))
    out = ctx.outcome
    if out is None:
        raise RuntimeError("no deployment solve method applied")
    ctx.progress.report("done" if out.value is not None else f"done: {out.status.value}", out.value, out.bound)
    if ctx.budget.deadline is None:  # no limit: the explanations get a share of the main solve's time
        s = ctx.settings
        took = time.perf_counter() - ctx.t0
        ctx.budget = Budget(ctx.budget.start, None,
                            time.perf_counter() + min(s.explain_max_s, max(s.explain_min_s, s.explain_ratio * took)),
                            ctx.budget.cut)
    if ctx.compare:
        main = ctx.outcome
        run_methods(ctx, methods.load(methods.AFTER))
        if ctx.outcome is not main:  # a comparison row beat the main plan (its row was reported): end again
            out = ctx.outcome
            ctx.progress.report("done" if out.value is not None else f"done: {out.status.value}", out.value, out.bound)
    return ctx.outcome


def solve_deployment(problem: Problem, objective="cost", time_limit_s: Optional[float] = None,
                     degrees=None, perf: Optional[PerfModel] = None, layouts=None, anytime: bool = True,
                     progress: Optional[Progress] = None, settings: Optional[SolverSettings] = None) -> SolveOutcome:
    """The main methods of the strategy on ``problem`` within ``time_limit_s`` (s, default
    ``settings.default_time_limit_s``); no comparison rows.

    Args:
        problem: resolved problem.
        objective: a deployment objective (name or object, see ``objectives/deployment/``).
        degrees: restrict the TP degrees (default: the problem's).
        layouts: restrict the layouts (batched / layout problems; default: the problem's).
        anytime: allow the anytime search (else the exact formulations alone).
        progress: where ``--progress`` rows go (default: nowhere).
        settings: shares and tuning constants (default :class:`SolverSettings`).
    Returns:
        SolveOutcome; ``status`` is INFEASIBLE when no plan meets the limits.
    Raises:
        InputError: unknown objective, or one whose inputs are missing.
    """
    settings = settings or SolverSettings()
    obj = resolve_objective(problem, objective)
    perf = perf or PerfModel(problem)
    seconds = settings.default_time_limit_s if time_limit_s is None else time_limit_s
    main = Budget.seconds(seconds)
    ctx = SolveContext(problem, perf, obj, budget=main, main=main, progress=progress or Progress.off(),
                       settings=settings, degrees=None if degrees is None else tuple(degrees),
                       layouts=None if layouts is None else tuple(layouts), anytime=anytime)
    return solve(ctx)
