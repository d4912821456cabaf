"""Lexicographic solve of the build-out model with CP-SAT.

Stages (each a CP-SAT solve of the same model; after a stage its objective is fixed at the
value found, ``==`` when proven optimal, otherwise ``<=``/``>=`` so later stages cannot
make it worse):

1. the primary objective (``gpus`` max, ``cost`` min or ``racks`` min);
2. fewest racks, then fewest liquid racks (air preferred on ties), two stages, see
   :mod:`objectives.buildout.racks`;
3. lowest cost (when every server type has a cost and cost was not the primary);
4. least power;
5. fewest switch chips, then fewest leaf-spine links (with a fabric).

The reported status is ``optimal`` only when every stage was proven optimal; the reported
bound and gap are those of the primary stage.

CP-SAT parameters (:func:`solver_parameters`): no LNS, no presolve probing or symmetry
detection, no search log. LNS is off because an LNS fragment that CP-SAT judges infeasible is
reported by OR-Tools as ``LOG(ERROR) "Infeasible LNS solution! ... solved with params ..."``
(``cp_model_solver.cc``) straight to the process's stderr through absl logging, which
``log_search_progress``/``log_to_stdout`` do not control; with ``use_lns=False`` no LNS
fragment is ever solved, so that dump cannot reach the user. Each stage is first solved by
one worker for up to ``FAST_TRY_S`` (measured on the README cases: 0.005-0.065 s per run,
about 40 % less than two workers, which pay thread start-up on every one of the ~10 solves);
a stage one worker has not settled by then is re-solved with ``SEARCH_WORKERS`` workers (one
worker alone left a 500 MW fewest-leaf-spine-links stage unproven after 20 s; two prove it in
0.07 s). Probing and symmetry detection cost more than they saved on these models (about
20 % less CP-SAT time in total over the 109 stage and what-if models of the benchmark cases).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from objectives.buildout import BuildoutObjective
from objectives.buildout import racks as buildout_racks
from optimizer.budget import Budget
from optimizer.buildout.evaluate import Evaluation
from optimizer.buildout.model import BuildoutModel, build, values
from optimizer.buildout.plan import BuildoutPlan
from optimizer.buildout.schema import Problem
from optimizer.cpsat import CpSolveOutcome
from optimizer.result import ConstraintKey, SolverStats, Status, relative_gap

DEFAULT_TIME_LIMIT_S = 60.0  # without --time-limit: all stages together
SOLVE_SHARE = 0.6  # with a time limit: the lexicographic solve's share of the budget, the explanation's what-ifs the rest
MIN_SOLVE_S = 0.25  # the solve gets at least this long, even when start-up has used the budget
SEARCH_WORKERS = 2
FAST_TRY_S = 0.5


def solver_parameters(solver: cp_model.CpSolver, time_limit_s: float | None, workers: int = SEARCH_WORKERS) -> None:
    """Set the build-out's CP-SAT parameters on ``solver`` (see the module docstring)."""
    prm = solver.parameters
    if time_limit_s is not None:
        prm.max_time_in_seconds = max(0.01, float(time_limit_s))
    prm.num_workers = workers
    prm.random_seed = 0
    prm.use_lns = False
    prm.log_search_progress = False
    prm.cp_model_probing_level = 0  # presolve probing and symmetry detection cost more than they
    prm.symmetry_level = 0          # save on these small models (see the module docstring)


_STATUS = {cp_model.OPTIMAL: Status.OPTIMAL, cp_model.FEASIBLE: Status.FEASIBLE,
           cp_model.INFEASIBLE: Status.INFEASIBLE}


def _solve_once(model: cp_model.CpModel, time_limit_s: float | None, workers: int) -> tuple[int, cp_model.CpSolver]:
    solver = cp_model.CpSolver()
    solver_parameters(solver, time_limit_s, workers)
    return solver.solve(model), solver


def cp_solve(model: cp_model.CpModel, time_limit_s: float | None) -> CpSolveOutcome:
    """Solve a build-out model; objective and bound in model units.

    First one worker for at most ``FAST_TRY_S`` (no thread start-up, fastest on the usual
    stages); a stage it has not settled (proven optimal or infeasible) by then is solved again
    with ``SEARCH_WORKERS`` workers for the rest of the time limit (see the module docstring).

    Raises:
        RuntimeError: CP-SAT reports the model invalid (a modelling bug).
    """
    t0 = time.perf_counter()
    first = FAST_TRY_S if time_limit_s is None else min(FAST_TRY_S, time_limit_s)
    code, solver = _solve_once(model, first, 1)
    if code in (cp_model.FEASIBLE, cp_model.UNKNOWN):
        left = None if time_limit_s is None else time_limit_s - (time.perf_counter() - t0)
        if left is None or left > 0.01:
            code2, solver2 = _solve_once(model, left, SEARCH_WORKERS)
            if code2 != cp_model.UNKNOWN or code == cp_model.UNKNOWN:
                code, solver = code2, solver2
    dt = time.perf_counter() - t0
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT model invalid: {model.validate()}")
    st = _STATUS.get(code, Status.TIME_LIMIT)
    found = model.has_objective() and st in (Status.OPTIMAL, Status.FEASIBLE)
    return CpSolveOutcome(st, solver, dt, solver.objective_value if found else None,
                          solver.best_objective_bound if found else None)


@dataclass(frozen=True)
class StageResult:
    name: str
    status: Status
    value: float | None
    time_s: float


@dataclass(frozen=True)
class BuildoutSolution:
    """The outcome of a build-out solve, never changed afterwards.

    Attributes:
        status: optimal only when every stage was proven optimal.
        objective: the primary objective.
        plan: the plan, None without one (infeasible, or no plan within the time limit).
        value, bound: the primary objective's value and proven bound, in its unit.
        stats: CP-SAT statistics; ``time_s`` is the CP-SAT time of the stages (and of the
            conflict search when infeasible).
        stages: each lexicographic stage solved.
        conflict: the conflicting constraint keys when infeasible (empty otherwise).
        evaluation: the independent evaluator's figures of ``plan`` (None without a plan).
        wall_s: wall time of the solve (model building, stages, conflict search, check), s.
    """

    status: Status
    objective: BuildoutObjective
    plan: BuildoutPlan | None
    value: float | None
    bound: float | None
    stats: SolverStats
    stages: tuple[StageResult, ...] = ()
    conflict: tuple[ConstraintKey, ...] = ()
    evaluation: Evaluation | None = None
    wall_s: float = 0.0


def _stages(p: Problem, model: BuildoutModel) -> list[tuple[str, Any, str]]:
    obj = p.objective
    st = [(obj.name, obj.expr(model), obj.sense)]
    st += buildout_racks.secondary_stages(model)
    if all(t.cost is not None for t in p.types):
        st.append(("cost", model.cost_c, "min"))
    # the primary objective is not solved again as a secondary stage
    st = st[:1] + [s for s in st[1:] if s[0] != st[0][0]]
    st.append(("power", model.power_w, "min"))
    if p.fabric is not None:
        st.append(("switch chips", model.leaves + model.s, "min"))
        st.append(("leaf-spine links", model.uplinks, "min"))
    return st


def solve_stage(model: BuildoutModel, objective_expr, sense: str, time_limit_s: float | None) -> CpSolveOutcome:
    """Set ``objective_expr`` (``sense`` min or max) on the model and solve it once."""
    m = model.cp
    if sense == "max":
        m.maximize(objective_expr)
    else:
        m.minimize(objective_expr)
    return cp_solve(m, time_limit_s)


def solve(p: Problem, budget: Budget) -> BuildoutSolution:
    """Solve the build-out problem lexicographically for ``p.objective`` (module docstring).

    Args:
        p: the resolved problem.
        budget: every stage ends by its deadline (without a limit: ``DEFAULT_TIME_LIMIT_S``).
    Returns:
        The solution (``evaluation`` not yet filled: see :func:`optimizer.buildout.evaluate`);
        when infeasible, ``conflict`` names the conflicting constraints.
    """
    t_start = time.perf_counter()
    if not budget.limited:
        budget = budget.within(DEFAULT_TIME_LIMIT_S)
    obj = p.objective
    model = build(p)
    stages: list[StageResult] = []
    value = bound = None
    status = Status.OPTIMAL
    solver_time = 0.0
    allv = model.all_variables()
    last = None
    for i, (name, expr, sense) in enumerate(_stages(p, model)):
        left = budget.remaining_s()
        if i > 0 and left <= 0.01:  # keep the plan found so far; later stages are unproven
            status = Status.FEASIBLE
            budget.note_cut("build-out secondary stages")
            break
        out = solve_stage(model, expr, sense, left)
        solver_time += out.time_s
        if i == 0:
            if out.status in (Status.INFEASIBLE, Status.TIME_LIMIT):
                conflict: list[ConstraintKey] = []
                if out.status == Status.INFEASIBLE:
                    t_c = time.perf_counter()
                    conflict = build(p, explain=True).named.conflicting_keys(
                        time_limit_s=max(1.0, budget.remaining_s())) or []
                    solver_time += time.perf_counter() - t_c
                stats = SolverStats("cp-sat", out.status, solver_time, None, None, None, 1)
                return BuildoutSolution(out.status, obj, None, None, None, stats,
                                        (StageResult(name, out.status, None, out.time_s),), tuple(conflict),
                                        wall_s=time.perf_counter() - t_start)
            value, bound = obj.to_unit(out.objective, model), obj.to_unit(out.bound, model)
            status = out.status
        elif out.status not in (Status.OPTIMAL, Status.FEASIBLE):
            stages.append(StageResult(name, out.status, None, out.time_s))
            status = Status.FEASIBLE
            break
        elif out.status == Status.FEASIBLE:
            status = Status.FEASIBLE
        stages.append(StageResult(name, out.status, out.objective, out.time_s))
        last = out
        val = int(round(out.objective))
        m = model.cp
        if out.status == Status.OPTIMAL:
            m.add(expr == val)
        elif sense == "max":
            m.add(expr >= val)
        else:
            m.add(expr <= val)
        m.clear_hints()
        for v in allv:
            m.add_hint(v, out.solver.value(v))
    plan = values(last.solver, model) if last is not None else None  # once, from the last stage solved
    gap = relative_gap(value, bound) if stages and stages[0].status == Status.FEASIBLE else 0.0
    stats = SolverStats("cp-sat", status, solver_time, value, bound, gap, len(stages))
    return BuildoutSolution(status, obj, plan, value, bound, stats, tuple(stages),
                            wall_s=time.perf_counter() - t_start)
