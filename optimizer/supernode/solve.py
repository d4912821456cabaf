"""Lexicographic CP-SAT solve of the supernode model.

Stages (each fixes the previous stage's value, ``==`` when proven optimal, otherwise a bound
in the stage's direction):

1. the primary objective (``throughput``, ``sessions``, ``cards`` or ``single_user``);
2. a secondary: most sessions after ``throughput``, most tokens/s after the others;
   with a ``supernode.fabric`` section then the least fabric cost (USD) unless the primary is ``cost``;
3. a deterministic tie-break between options with equal figures: the earliest option in
   :func:`optimizer.supernode.perf.options` order (smaller sizes, tiers in the order listed).

The status is ``optimal`` only when every stage is proven; bound and gap are those of stage 1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from objectives.supernode import SupernodeObjective, registry as objective_registry
from optimizer.budget import Budget
from optimizer.cpsat import solve_cp
from optimizer.result import ConstraintKey, SolverStats, Status, relative_gap
from optimizer.supernode.evaluate import Evaluation
from optimizer.supernode.model import build
from optimizer.supernode.perf import OptionResult, evaluate_all, options
from optimizer.supernode.plan import BuiltOption, SupernodePlan
from optimizer.supernode.schema import Problem

DEFAULT_TIME_LIMIT_S = 30.0  # without --time-limit: all stages together
CONFLICT_TIME_S = 10.0       # at most this long for the minimal conflict of an infeasible instance
EVALUATE_SHARE = 0.85        # of the time left, at most, for the options' performance model (at least one option)


@dataclass(frozen=True)
class SupernodeSolution:
    """The outcome of a supernode solve, never changed afterwards.

    Attributes:
        status: optimal only when every stage is proven.
        objective: the primary objective.
        plan: the instances built, None without a plan.
        value, bound: the primary stage's value and proven bound, in the objective's unit.
        stats: CP-SAT statistics of all stages.
        results: every option evaluated (:func:`optimizer.supernode.perf.evaluate_all`).
        stages: ``(name, status, seconds)`` of each stage solved.
        conflict: the conflicting constraint keys when infeasible (empty otherwise).
        evaluation: the independent re-check of ``plan`` (None without a plan).
    """

    status: Status
    objective: SupernodeObjective
    plan: SupernodePlan | None
    value: float | None
    bound: float | None
    stats: SolverStats
    results: tuple[OptionResult, ...]
    stages: tuple[tuple[str, Status, float], ...] = ()
    conflict: tuple[ConstraintKey, ...] = ()
    wall_s: float = 0.0  # wall time of the solve and its independent re-check (the pipeline's solve), s
    evaluation: Evaluation | None = None
    skipped_options: int = 0  # options the time limit left unevaluated (the claims then cover the others only)


def solve(p: Problem, budget: Budget, results: list[OptionResult] | None = None) -> SupernodeSolution:
    """Evaluate every option, then solve the stages for ``p.objective`` (module docstring).

    Args:
        p: the resolved problem.
        budget: every stage ends by its deadline (without a limit: ``DEFAULT_TIME_LIMIT_S``).
        results: pre-evaluated options (what-if sweeps reuse them), else evaluated here.
    Returns:
        The solution (``evaluation`` not yet filled); when infeasible, ``conflict`` names a
        minimal set of conflicting constraints.
    """
    if not budget.limited:
        budget = budget.within(DEFAULT_TIME_LIMIT_S)
    skipped = 0
    if results is None:
        # the options' performance model takes at most EVALUATE_SHARE of the time left
        results = evaluate_all(p, time.perf_counter() + EVALUATE_SHARE * budget.remaining_s())
        skipped = len(options(p)) - len(results)
        if skipped:
            budget.note_cut(f"supernode options: {skipped} of {skipped + len(results)} not evaluated")
    else:
        results = list(results)
    obj = p.objective
    model = build(p, results, with_built_flags=obj.needs_built_flags())
    m = model.cp
    stages: list[tuple[str, Status, float]] = []
    secondary = objective_registry()[obj.secondary]
    sequence = [(obj.name, obj, obj.sense), (secondary.name, secondary, "max"), ("tie-break", None, "min")]
    if p.fabric is not None and obj.name != "cost" and any(r.fabric is not None and round(r.fabric.cost_usd) > 0
                                                           for r in results):  # with a fabric, the cheapest fabric among equals
        sequence.insert(2, ("fabric cost", "fabric_cost", "min"))
    primary = None
    solver_time = 0.0
    values = None
    for i, (name, stage_obj, sense) in enumerate(sequence):
        if stage_obj is None:
            expr = sum(j * x for j, x in enumerate(model.x))
        elif stage_obj == "fabric_cost":
            expr = model.fabric_cost
        else:
            expr = stage_obj.expr(model)
        m.minimize(expr) if sense == "min" else m.maximize(expr)
        left = max(0.05, budget.remaining_s())
        hint = values
        if hint is not None:
            m.clear_hints()
            for x, v in zip(model.x, hint):
                m.add_hint(x, v)
        out = solve_cp(m, left)
        solver_time += out.time_s
        stages.append((name, out.status, out.time_s))
        if out.status in (Status.INFEASIBLE, Status.TIME_LIMIT):
            if i == 0:
                stats = SolverStats("cp-sat", out.status, solver_time, solves=1)
                conflict: list[ConstraintKey] = []
                if out.status == Status.INFEASIBLE:
                    conflict = build(p, results, explain=True).named.minimal_conflict(
                        min(CONFLICT_TIME_S, max(budget.remaining_s(), 0.05))) or []
                status = out.status if not skipped else Status.TIME_LIMIT  # unevaluated options may fit
                return SupernodeSolution(status, obj, None, None, None, stats, tuple(results), tuple(stages),
                                         tuple(conflict) if not skipped else (), skipped_options=skipped)
            break
        values = [int(out.solver.value(x)) for x in model.x]
        if i == 0:
            primary = out
        obj_val = int(round(out.objective))
        if out.status == Status.OPTIMAL:
            m.add(expr == obj_val)
        else:
            m.add(expr >= obj_val) if sense == "max" else m.add(expr <= obj_val)
    value = obj.to_unit(primary.objective, model)
    bound = obj.to_unit(primary.bound, model) if not skipped else None  # a bound over the evaluated options only
    status = Status.OPTIMAL if all(s == Status.OPTIMAL for _, s, _ in stages) and not skipped else Status.FEASIBLE
    stats = SolverStats("cp-sat", status, solver_time, value, bound, relative_gap(value, bound), solves=len(stages))
    plan = SupernodePlan(tuple(BuiltOption(results[j].option, results[j].sessions_per_card, v, j)
                               for j, v in enumerate(values) if v))
    return SupernodeSolution(status, obj, plan, value, bound, stats, tuple(results), tuple(stages),
                             skipped_options=skipped)
