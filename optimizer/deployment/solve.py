"""Solve a deployment problem: pick the formulation, run CP-SAT (Dinkelbach for cost),
extract the plan, re-check it with the independent evaluator."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Optional

from objectives import cost as cost_obj
from objectives import energy as energy_obj
from objectives import latency as latency_obj
from objectives import makespan as makespan_obj
from optimizer.cpsat import solve_cp
from optimizer.deployment.evaluate import Evaluation, Plan, PlannedInstance, evaluate
from optimizer.deployment.formulation import TIME_UNIT_S, Formulation, degree_fits_hardware
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import Problem
from optimizer.errors import InputError
from optimizer.result import SolverStats, Status, relative_gap

OBJECTIVES = {"cost": cost_obj, "makespan": makespan_obj, "latency": latency_obj, "energy": energy_obj}
DEFAULT_TIME_LIMIT_S = 60.0


@dataclass
class SolveOutcome:
    """What :func:`solve_deployment` returns.

    Attributes:
        status: optimal / feasible (gap) / infeasible / time_limit.
        objective: name.
        value: objective of the plan, re-computed by the evaluator (objective's unit).
        bound: proven bound in the same unit (None if unknown).
        evaluation: evaluator's re-check of the plan (None without a plan).
        stats: solver statistics.
        degrees: TP degrees the plan was allowed to use.
        mode: formulation used (aggregate / sequence).
    """

    status: Status
    objective: str
    value: Optional[float]
    bound: Optional[float]
    evaluation: Optional[Evaluation]
    stats: SolverStats
    degrees: tuple[int, ...]
    mode: str
    notes: list[str] = field(default_factory=list)


def choose_mode(problem: Problem, objective: str) -> str:
    """``sequence`` when order matters beyond EDD (faults, latency), else ``aggregate``."""
    return "sequence" if (problem.faults or objective == "latency") else "aggregate"


def usable_degrees(problem: Problem, perf: PerfModel, degrees) -> list[int]:
    out = []
    for p in degrees:
        if degree_fits_hardware(problem, p) is not None:
            continue
        if all(perf.max_sessions(p, c.context, c.new) == 0 for c in problem.classes):
            continue
        out.append(p)
    return out


def build(problem: Problem, perf: PerfModel, degrees, objective: str, explain: bool = False) -> Formulation:
    mode = choose_mode(problem, objective)
    f = Formulation(problem, perf, degrees, mode, latency=(objective == "latency"), explain=explain)
    if objective == "cost":
        f.required = max(f.required, 1)
    return f.build()


def solve_deployment(problem: Problem, objective: str = "cost", time_limit_s: Optional[float] = None,
                     degrees=None, perf: Optional[PerfModel] = None) -> SolveOutcome:
    """Find the optimal deployment plan.

    Args:
        problem: resolved problem.
        objective: cost | makespan | latency | energy.
        time_limit_s: wall-clock budget for all solver calls (default 60 s).
        degrees: restrict the TP degrees (default: the problem's).
    Returns:
        SolveOutcome; ``status`` is INFEASIBLE when no plan meets the limits.
    Raises:
        InputError: unknown objective.
    """
    if objective not in OBJECTIVES:
        raise InputError(problem.path, "--objective", f"unknown objective '{objective}' (one of: {', '.join(OBJECTIVES)})")
    perf = perf or PerfModel(problem)
    limit = DEFAULT_TIME_LIMIT_S if time_limit_s is None else time_limit_s
    deadline = time.perf_counter() + limit
    allowed = tuple(problem.degrees if degrees is None else degrees)
    usable = usable_degrees(problem, perf, allowed)
    mode = choose_mode(problem, objective)
    stats = SolverStats("cp-sat", Status.INFEASIBLE, 0.0, solves=0)
    if not usable:
        return SolveOutcome(Status.INFEASIBLE, objective, None, None, None, stats, allowed, mode)

    def remaining() -> float:
        return max(0.05, deadline - time.perf_counter())

    obj_mod = OBJECTIVES[objective]
    if objective != "cost":
        f = build(problem, perf, usable, objective)
        obj_mod.apply(f)
        out = solve_cp(f.model, remaining())
        stats.time_s += out.time_s
        stats.solves += 1
        if out.status in (Status.INFEASIBLE, Status.TIME_LIMIT):
            stats.status = out.status
            return SolveOutcome(out.status, objective, None, None, None, stats, allowed, mode)
        plan = extract_plan(f, out.solver)
        ev = evaluate(problem, plan, perf)
        value = ev.objective_value(objective)
        bound = _bound_in_unit(problem, objective, out.bound, f)
        status = out.status
        return _finish(status, objective, value, bound, ev, stats, allowed, mode)

    # cost: Dinkelbach iterations, starting from a feasible plan of least worst-case makespan
    f = build(problem, perf, usable, "cost")
    makespan_obj.apply(f)
    out = solve_cp(f.model, remaining())
    stats.time_s += out.time_s
    stats.solves += 1
    if out.status in (Status.INFEASIBLE, Status.TIME_LIMIT):
        stats.status = out.status
        return SolveOutcome(out.status, objective, None, None, None, stats, allowed, mode)
    lam = cost_obj.ratio(f, out.solver)
    best_f, best_solver = f, out.solver
    proven = False
    bound_ratio: Optional[Fraction] = None
    hint = _solution(out.solver, f)
    while time.perf_counter() < deadline:
        f = build(problem, perf, usable, "cost")
        cost_obj.apply(f, lam)
        _add_hint(f, hint)
        out = solve_cp(f.model, remaining())
        stats.time_s += out.time_s
        stats.solves += 1
        if out.status not in (Status.OPTIMAL, Status.FEASIBLE):
            break
        new_lam = cost_obj.ratio(f, out.solver)
        if out.status == Status.OPTIMAL and out.objective >= 0:
            proven = True
            bound_ratio = lam
            break
        # the objective's proven bound gives a bound on the optimal ratio
        fb = min(0.0, out.bound) / lam.denominator
        rmin = max(1, f.required)
        cand = lam + Fraction(fb).limit_denominator(10 ** 6) / rmin
        bound_ratio = cand if bound_ratio is None else max(bound_ratio, cand)
        if new_lam < lam:
            lam, best_f, best_solver = new_lam, f, out.solver
            hint = _solution(out.solver, f)
        else:
            break  # no progress within the time limit
    plan = extract_plan(best_f, best_solver)
    ev = evaluate(problem, plan, perf)
    value = ev.objective_value("cost")
    tick_to_s = TIME_UNIT_S
    bound = float(bound_ratio) * tick_to_s if bound_ratio is not None else None
    if proven:
        bound = min(value, bound)  # exact arithmetic may shave the tick rounding
    status = Status.OPTIMAL if proven else Status.FEASIBLE
    return _finish(status, "cost", value, bound, ev, stats, allowed, mode)


def _finish(status, objective, value, bound, ev, stats, allowed, mode) -> SolveOutcome:
    stats.status = status
    stats.objective = value
    stats.bound = bound
    stats.gap = 0.0 if status == Status.OPTIMAL else relative_gap(value, bound)
    notes = []
    if ev.violations:
        notes.append("evaluator re-check failed: " + "; ".join(ev.violations))
    return SolveOutcome(status, objective, value, bound, ev, stats, allowed, mode, notes)


def _bound_in_unit(problem: Problem, objective: str, bound_ticks, f) -> Optional[float]:
    if bound_ticks is None:
        return None
    s = bound_ticks * TIME_UNIT_S
    if objective == "makespan":
        return s * 1e3
    if objective == "energy":
        return energy_obj.from_makespan_s(problem, s)
    if objective == "latency":
        return s * 1e3 / len(problem.sessions)
    raise ValueError(objective)


def _solution(solver, f) -> list[int]:
    return list(solver.response_proto.solution)


def _add_hint(f, values: list[int]) -> None:
    variables = f.model.proto.variables
    for i, v in enumerate(values):
        if i >= len(variables):
            break
        f.model.proto.solution_hint.vars.append(i)
        f.model.proto.solution_hint.values.append(v)


# ---------------------------------------------------------------------------- plan


def extract_plan(f: Formulation, solver) -> Plan:
    """Turn solver values into instances with ordered sessions and GPU ids."""
    problem = f.problem
    pools = {c.index: list(c.session_ids) for c in f.classes}
    chosen: list[tuple] = []  # (slot, [session ids])
    for k in f.slots:
        if not solver.boolean_value(f.used[k.index]):
            continue
        order: list[str] = []
        if f.mode == "aggregate":
            on_time, late = [], []
            for c in f.classes:
                x = f.x.get((k.index, c.index))
                if x is None:
                    continue
                nx = solver.value(x)
                ny = solver.value(f.y[k.index, c.index]) if (k.index, c.index) in f.y else nx
                ids = [pools[c.index].pop(0) for _ in range(nx)]
                key = c.deadline_s if c.deadline_s is not None else float("inf")
                on_time += [(key, i) for i in ids[:ny]]
                late += [(key, i) for i in ids[ny:]]
            order = [i for _, i in sorted(on_time, key=lambda t: t[0])] + [i for _, i in sorted(late, key=lambda t: t[0])]
        else:
            for q in range(f.Q[k.index]):
                for c in f.classes:
                    z = f.z.get((k.index, q, c.index))
                    if z is not None and solver.boolean_value(z):
                        order.append(pools[c.index].pop(0))
        chosen.append((k, order))
    return Plan(_assign_gpus(f, solver, chosen))


def _assign_gpus(f: Formulation, solver, chosen) -> list[PlannedInstance]:
    G = f.problem.server.gpus
    holds = getattr(f, "holds", {})
    idle = getattr(f, "idle", {})
    free = {s: list(range(s * G, (s + 1) * G)) for s in range(f.problem.servers)}
    # GPUs named by faults go where the solver put them
    want: dict[int, list[int]] = {}  # slot index -> named gpus it must hold
    reserved_idle: set[int] = set()
    for (g, kidx), lit in holds.items():
        if solver.boolean_value(lit):
            want.setdefault(kidx, []).append(g)
    for g, lit in idle.items():
        if solver.boolean_value(lit):
            reserved_idle.add(g)
    named = {g for gs in want.values() for g in gs} | reserved_idle
    for s in free:
        free[s] = [g for g in free[s] if g not in named]
    out = []
    for n, (k, order) in enumerate(sorted(chosen, key=lambda t: (t[0].servers[0], -t[0].degree, t[0].ordinal))):
        gpus = list(want.get(k.index, []))
        for s in k.servers:
            need = k.gpus_each - sum(1 for g in gpus if g // G == s)
            gpus += free[s][:need]
            free[s] = free[s][need:]
        out.append(PlannedInstance(f"i{n}", k.degree, k.servers, tuple(sorted(gpus)), order))
    return out


def max_on_time(problem: Problem, perf: PerfModel, degrees, time_limit_s: float) -> Optional[int]:
    """Most sessions that can finish on time (worst fault scenario) with these degrees,
    ignoring the on-time requirement; None if the sessions cannot all be placed."""
    usable = usable_degrees(problem, perf, degrees)
    if not usable:
        return None
    f = Formulation(problem, perf, usable, choose_mode(problem, "cost"))
    f.required = 0
    f.build()
    t = f.model.new_int_var(0, len(problem.sessions), "min_on_time")
    for sc in f.scenarios:
        if isinstance(sc.on_time, int):
            f.model.add(t <= sc.on_time)
            continue
        ct = f.model.add(t <= sc.on_time)
        if sc.enforce:
            ct.only_enforce_if(sc.enforce)
    f.model.maximize(t)
    out = solve_cp(f.model, time_limit_s)
    if out.status not in (Status.OPTIMAL, Status.FEASIBLE):
        return None
    return int(out.solver.value(t))


def conflicts(problem: Problem, perf: PerfModel, objective: str, time_limit_s: float = 10.0):
    """Named constraints that cannot hold together (a minimal set when time allows).

    Returns:
        (keys, formulation) — keys is empty when the model could not be explained in time.
    """
    usable = usable_degrees(problem, perf, problem.degrees)
    if not usable:
        return [], None
    f = build(problem, perf, usable, objective, explain=True)
    keys = f.nm.minimal_conflict(time_limit_s)
    return (keys or []), f
