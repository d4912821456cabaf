"""Lexicographic CP-SAT solve of the supernode model.

Stages (each fixes the previous stage's value, ``==`` when proven optimal, otherwise a bound
in the stage's direction):

1. the primary objective (``throughput``, ``sessions``, ``cards`` or ``single_user``);
2. a secondary: most sessions after ``throughput``, most tokens/s after the others;
3. a deterministic tie-break between options with equal figures: the earliest option in
   :func:`optimizer.supernode.perf.options` order (smaller sizes, tiers in the order listed).

The status is ``optimal`` only when every stage is proven; bound and gap are those of stage 1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from objectives.supernode import registry as objective_registry
from optimizer.cpsat import solve_cp
from optimizer.result import ConstraintKey, SolverStats, Status, relative_gap
from optimizer.supernode.model import Ctx, build
from optimizer.supernode.perf import OptionResult, evaluate_all
from optimizer.supernode.schema import Problem


# {name: module}, one module per objective in objectives/supernode/ (found, not listed here)
OBJECTIVE_MODULES = {name: o.module for name, o in objective_registry().items()}
DEFAULT_TIME_LIMIT_S = 30.0


@dataclass
class SolveResult:
    """Outcome of :func:`solve`: ``plan`` maps option index -> instances (None without a plan);
    ``value``/``bound`` are in the objective's unit; ``conflict`` holds keys when infeasible."""

    status: Status
    objective: str
    plan: dict[int, int] | None
    value: float | None
    bound: float | None
    stats: SolverStats
    results: list[OptionResult]
    stages: list[tuple[str, Status, float]] = field(default_factory=list)
    conflict: list[ConstraintKey] | None = None


def _objective(nm, ctx: Ctx, name: str):
    mod = OBJECTIVE_MODULES[name]
    return mod.add(nm, ctx) if hasattr(mod, "add") else mod.expr(ctx)


def solve(p: Problem, objective: str, time_limit_s: float | None = None,
          results: list[OptionResult] | None = None) -> SolveResult:
    """Evaluate every option, then solve the stages (see the module docstring).

    Args:
        p: the resolved problem.
        objective: one of :data:`OBJECTIVE_MODULES`.
        time_limit_s: wall-clock limit for all stages (default 30 s).
        results: pre-evaluated options (what-if sweeps reuse them), else evaluated here.
    """
    t0 = time.perf_counter()
    results = evaluate_all(p) if results is None else results
    limit = DEFAULT_TIME_LIMIT_S if time_limit_s is None else time_limit_s
    nm, ctx = build(p, results,
                    with_single_user=getattr(OBJECTIVE_MODULES[objective], "NEEDS_SINGLE_USER_VARS", False))
    m = nm.model
    stages: list[tuple[str, Status, float]] = []
    sequence = [(objective, OBJECTIVE_MODULES[objective].SENSE), (OBJECTIVE_MODULES[objective].SECONDARY, "max"), ("tie-break", "min")]
    primary = None
    solver_time = 0.0
    values = None
    for i, (name, sense) in enumerate(sequence):
        if name == "tie-break":
            expr = sum(j * x for j, x in enumerate(ctx.x))
        else:
            expr = _objective(nm, ctx, name)
        m.minimize(expr) if sense == "min" else m.maximize(expr)
        left = max(0.05, limit - (time.perf_counter() - t0))
        hint = values
        if hint is not None:
            m.clear_hints()
            for x, v in zip(ctx.x, hint):
                m.add_hint(x, v)
        out = solve_cp(m, left)
        solver_time += out.time_s
        stages.append((name, out.status, out.time_s))
        if out.status in (Status.INFEASIBLE, Status.TIME_LIMIT):
            if i == 0:
                stats = SolverStats("cp-sat", out.status, solver_time, solves=1)
                conflict = None
                if out.status == Status.INFEASIBLE:
                    enm, _ = build(p, results, explain=True)
                    conflict = enm.minimal_conflict(min(10.0, limit)) or []
                return SolveResult(out.status, objective, None, None, None, stats, results, stages, conflict)
            break
        values = [int(out.solver.value(x)) for x in ctx.x]
        if i == 0:
            primary = out
        obj_val = int(round(out.objective))
        if out.status == Status.OPTIMAL:
            m.add(expr == obj_val)
        else:
            m.add(expr >= obj_val) if sense == "max" else m.add(expr <= obj_val)
    mod = OBJECTIVE_MODULES[objective]
    value = mod.to_unit(primary.objective, ctx)
    bound = mod.to_unit(primary.bound, ctx)
    status = Status.OPTIMAL if all(s == Status.OPTIMAL for _, s, _ in stages) else Status.FEASIBLE
    stats = SolverStats("cp-sat", status, solver_time, value, bound, relative_gap(value, bound), solves=len(stages))
    plan = {j: v for j, v in enumerate(values) if v}
    return SolveResult(status, objective, plan, value, bound, stats, results, stages)
