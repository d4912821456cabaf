"""One MILP per mode (PuLP + HiGHS) choosing how many workers of each configuration.

Variables ``n_j >= 0`` integer per usable configuration j (rate r_j > 0); families in
``constraints/serving/`` (``capacity`` per role, ``gpus`` per pool); objective from
``objectives/serving/``. Two stages: (1) the objective; (2) with it fixed, the most spare
capacity ``Σ r_j·n_j / R`` over roles (ties go to the plan with the most headroom), or for
``goodput`` the fewest GPUs. The status is optimal only when both stages are proven; bound and
gap are stage 1's (HiGHS ``mip_dual_bound``). ``prob.sol_status`` is checked after each solve.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import pulp

from constraints.serving import capacity as c_capacity
from constraints.serving import gpus as c_gpus
from constraints.serving.worker import key as worker_key
from optimizer.result import ConstraintKey, Status
from optimizer.serving.perf import Worker
from optimizer.serving.schema import Problem

MODE_ROLES = {"aggregated": ("aggregated",), "disaggregated": ("prefill", "decode")}


@dataclass
class Ctx:
    problem: Problem
    workers: list[Worker]
    x: list
    roles: tuple
    rate: object  # float or LpVariable
    rate_value: float
    gpus_expr: object = None
    dollars_expr: object = None
    names: dict = field(default_factory=dict)

    def name(self, key: ConstraintKey) -> str:
        n = f"c{len(self.names)}"
        self.names[n] = key
        return n


@dataclass
class ModeResult:
    """Plan of one mode: ``counts`` {worker index: n}; value/bound in the objective's unit."""

    mode: str
    status: Status
    counts: dict[int, int] | None
    value: float | None
    bound: float | None
    time_s: float
    rate: float
    conflict: list[ConstraintKey] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    solves: int = 0


def _solve(prob: pulp.LpProblem, limit_s: float):
    from optimizer.highs import new_highs

    new_highs()  # HiGHS prints its banner on the first instance of a process: taken silently here
    solver = pulp.HiGHS(msg=False, timeLimit=max(0.1, limit_s))
    t0 = time.perf_counter()
    prob.solve(solver)
    dt = time.perf_counter() - t0
    bound = None
    try:
        bound = float(prob.solverModel.getInfo().mip_dual_bound)
    except Exception:  # pragma: no cover - older highspy
        bound = None
    return prob.sol_status, bound, dt


def solve_mode(p: Problem, workers: list[Worker], mode: str, objective, rate: float, limit_s: float = 20.0) -> ModeResult:
    """Solve one mode at request rate ``rate`` (ignored by ``goodput``).

    Returns an infeasible :class:`ModeResult` with the conflicting keys when a role has no usable
    configuration (their per-configuration limits), or when the pools cannot hold the workers
    (``gpus[pool ...]`` with ``capacity[role]``).
    """
    roles = MODE_ROLES[mode]
    idx = [j for j, w in enumerate(workers) if w.role in roles and w.rate > 0]
    t0 = time.perf_counter()
    for role in roles:
        if not any(workers[j].role == role for j in idx):
            bad = [w for w in workers if w.role == role]
            keys = [worker_key(w, p) for w in bad]
            details = [f"{w.label(p)}: {w.detail}" for w in bad] or [_no_layout_reason(p, role)]
            return ModeResult(mode, Status.INFEASIBLE, None, None, None, time.perf_counter() - t0, rate, keys, details)
    goodput = objective.sense == "max"
    sense = pulp.LpMaximize if goodput else pulp.LpMinimize
    prob = pulp.LpProblem(f"serving_{mode}", sense)
    x = [prob.add_variable(f"n{j}", lowBound=0, cat="Integer") for j in idx]
    sub = [workers[j] for j in idx]
    r = prob.add_variable("rate", lowBound=0) if goodput else rate
    ctx = Ctx(p, sub, x, roles, r, rate)
    ctx.gpus_expr = pulp.lpSum(w.gpus * v for w, v in zip(sub, x))
    ctx.dollars_expr = pulp.lpSum((p.pools[w.pool].price or 0.0) * w.gpus * v for w, v in zip(sub, x))
    c_capacity.add(prob, ctx)
    c_gpus.add(prob, ctx)
    expr = objective.expr(ctx)
    prob += expr
    status, bound, dt = _solve(prob, limit_s)
    solves = 1
    if status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        if status == pulp.LpSolutionNoSolutionFound and prob.status != pulp.LpStatusInfeasible:
            return ModeResult(mode, Status.TIME_LIMIT, None, None, None, dt, rate, solves=solves)
        keys = [c_gpus.key(pl.name) for pl in p.pools] + [c_capacity.key(role) for role in roles]
        details = [f"{c_gpus.describe(c_gpus.key(pl.name), ctx)}" for pl in p.pools]
        details += [f"{role} capacity needed {rate:g} req/s; the best configuration on a whole pool carries at most "
                    f"{max((p.pools[w.pool].count // w.gpus) * w.rate for w in sub if w.role == role):.3g} req/s"
                    for role in roles]
        return ModeResult(mode, Status.INFEASIBLE, None, None, None, dt, rate, keys, details, solves)
    proven = status == pulp.LpSolutionOptimal
    value = float(pulp.value(expr))
    # stage 2: keep the objective, take the most headroom (or, for goodput, the fewest GPUs)
    if goodput:
        prob += (expr >= value * (1 - 1e-9) - 1e-9, "stage1")
        prob.sense = pulp.LpMinimize
        prob.setObjective(ctx.gpus_expr)
    else:
        prob += (expr <= value * (1 + 1e-9) + 1e-9, "stage1")
        prob.sense = pulp.LpMaximize
        head = pulp.lpSum(w.rate * v for w, v in zip(sub, x)) / max(rate, 1e-12)
        prob.setObjective(head - 1e-6 * ctx.gpus_expr)
    st2, _, dt2 = _solve(prob, max(0.1, limit_s - dt))
    solves += 1
    if st2 not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):  # keep stage 1's plan
        st2 = pulp.LpSolutionIntegerFeasible
    proven = proven and st2 == pulp.LpSolutionOptimal
    counts = {}
    for j, v in zip(idx, x):
        n = int(round(v.value() or 0))
        if n:
            counts[j] = n
    value_out = float(r.value()) if goodput else value
    if goodput and bound is not None and bound < 0:
        bound = -bound  # PuLP hands HiGHS the negated objective of a maximisation
    if bound is None or not math.isfinite(bound):
        bound = value_out
    return ModeResult(mode, Status.OPTIMAL if proven else Status.FEASIBLE, counts, value_out, bound,
                      dt + dt2, value_out if goodput else rate, solves=solves)


def _no_layout_reason(p, role: str) -> str:
    """Why a role has no worker configuration at all (the layout rules it fails)."""
    r = p.roles[role]
    m = p.model
    asked = f"serving.{role}.tp allows {list(r.tp)}" if r.tp is not None else "every TP degree was tried"
    cap = f", at most {r.max_gpus} GPUs" if r.max_gpus else ""
    return (f"no valid {role} layout: {asked}{cap}; TP must split the {m.q_heads} attention heads and "
            f"{m.kv_heads} KV heads evenly and fit one server of the pools")
