"""One MILP per mode (HiGHS through highspy) choosing how many workers of each configuration.

Variables ``n_j >= 0`` integer per usable configuration j (rate r_j > 0; the others get none,
:mod:`constraints.serving.worker`), and for ``goodput`` the rate ``R >= 0`` (req/s). Rows come
from the families of ``constraints/serving/`` (``capacity`` and ``deploy`` per role, ``gpus`` per
pool), each named by its :class:`~optimizer.result.ConstraintKey` (``capacity[aggregated]``);
the objective's expression from ``objectives/serving/``. Two stages: (1) the objective; (2) with
it held (``objective[<name>]``), the most spare capacity ``Σ r_j·n_j / R`` over roles (ties go to
the plan with the most headroom), or for ``goodput`` the fewest GPUs. The status is optimal only
when both stages are proven; bound and gap are stage 1's (HiGHS ``mip_dual_bound``).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import highspy

from constraints.serving import capacity as c_capacity
from constraints.serving import deploy as c_deploy
from constraints.serving import gpus as c_gpus
from constraints.serving import homogeneous as c_homogeneous
from constraints.serving import objective as c_objective
from constraints.serving import pooling as c_pooling
from constraints.serving import simulated as c_simulated
from constraints.serving import worker as c_worker
from optimizer.highs import new_highs
from optimizer.result import ConstraintKey, Status
from optimizer.serving.perf import Worker
from optimizer.serving.schema import Problem

MODE_ROLES = {"aggregated": ("aggregated",), "disaggregated": ("prefill", "decode")}
ROW_FAMILIES = (c_pooling, c_capacity, c_simulated, c_deploy, c_gpus, c_homogeneous)  # the rows of stage 1, in this order
MIN_LIMIT_S = 0.1  # the shortest time limit a stage is given (s): HiGHS needs some to presolve


@dataclass(frozen=True)
class ModeData:
    """The input of one mode's MILP.

    Attributes:
        problem: the serving problem (pools, prices).
        mode: ``aggregated`` or ``disaggregated``.
        roles: the mode's roles (:data:`MODE_ROLES`).
        workers: the usable configurations of those roles (rate > 0), one variable each.
        index: each usable configuration's index in the full worker list (``counts`` keys).
        rate: the target rate R (req/s); ``goodput`` makes R a variable and uses it for nothing.
        unusable: the configurations of those roles with no rate (no variable; their keys make up
            the conflict of a role without a usable one).
        margins: ``{role: m}``, the capacity factor the simulation asked of a role (``simulated``
            rows for m > 1; absent: 1).
    """

    problem: Problem
    mode: str
    roles: tuple[str, ...]
    workers: tuple[Worker, ...]
    index: tuple[int, ...]
    rate: float
    unusable: tuple[Worker, ...] = ()
    margins: Mapping[str, float] = field(default_factory=dict)


def mode_data(p: Problem, workers: list[Worker], mode: str, rate: float,
              margins: Optional[Mapping[str, float]] = None) -> ModeData:
    """The :class:`ModeData` of ``mode`` at ``rate`` req/s over the configurations ``workers``,
    with the simulation's capacity factors ``margins`` (``{role: m >= 1}``, default none)."""
    roles = MODE_ROLES[mode]
    idx = tuple(j for j, w in enumerate(workers) if w.role in roles and w.rate > 0)
    unusable = tuple(w for role in roles for w in c_worker.unusable(workers, role))
    return ModeData(p, mode, roles, tuple(workers[j] for j in idx), idx, rate, unusable, dict(margins or {}))


class ServingMilp:
    """One mode's MILP on a ``highspy.Highs`` instance.

    Attributes:
        h: the HiGHS instance (one thread, silent: :func:`optimizer.highs.new_highs`).
        x: the worker counts ``n_j`` (integer columns named ``n[<configuration>]``).
        rate: R, req/s: a column for ``goodput``, else the target rate (a float).
        gpus: ``Σ g_j·n_j`` (GPUs); dollars: ``Σ price_pool·g_j·n_j`` ($/hour).
        rows: ``{row name: ConstraintKey}`` of every row added.
    """

    def __init__(self, data: ModeData, goodput: bool):
        self.h = h = new_highs()
        p = data.problem
        self.x = [h.addIntegral(lb=0, name=f"n[{w.label(p)}]") for w in data.workers]
        self.rate: Any = h.addVariable(lb=0, name="rate") if goodput else data.rate
        self.gpus = sum(w.gpus * v for w, v in zip(data.workers, self.x))
        self.dollars = sum((p.pools[w.pool].price or 0.0) * w.gpus * v for w, v in zip(data.workers, self.x))
        self.rows: dict[str, ConstraintKey] = {}

    def add(self, expr, key: ConstraintKey):
        """Add the row ``expr`` (a highspy comparison) named ``str(key)``."""
        self.rows[str(key)] = key
        return self.h.addConstr(expr, name=str(key))

    def value(self, expr) -> float:
        """``expr`` (a column, an expression or a number) at the last solution."""
        return float(expr) if isinstance(expr, (int, float)) else float(self.h.val(expr))


def build(data: ModeData, objective) -> ServingMilp:
    """Stage 1's model: the columns, every family's rows, no objective set yet."""
    model = ServingMilp(data, objective.sense == "max")
    for family in ROW_FAMILIES:
        family.define(model, data)
    return model


@dataclass(frozen=True)
class ModeResult:
    """Plan of one mode at one rate.

    Attributes:
        mode: ``aggregated`` or ``disaggregated``.
        status: optimal (both stages proven), feasible, infeasible or time_limit.
        counts: ``{worker index: n}`` (indices into the full worker list), None without a plan.
        value: the objective's value in its unit (goodput: the rate served, req/s), None without a plan.
        bound: stage 1's proven bound in the same unit (the value itself when HiGHS gives none).
        time_s: wall time of the HiGHS solves, s.
        rate: the rate planned for (req/s; goodput: the rate found).
        conflict: the conflicting constraints' keys when infeasible.
        details: one line per conflicting key (or why no layout exists).
        solves: HiGHS solves made (0: not begun).
    """

    mode: str
    status: Status
    counts: Optional[dict[int, int]]
    value: Optional[float]
    bound: Optional[float]
    time_s: float
    rate: float
    conflict: tuple[ConstraintKey, ...] = ()
    details: tuple[str, ...] = ()
    solves: int = 0


@dataclass(frozen=True)
class _Run:
    """One HiGHS solve: ``proven`` optimal, ``solution`` present (column values), ``infeasible``
    proven, stage's ``bound`` (None when HiGHS gives none) and wall time ``time_s``."""

    proven: bool
    solution: Optional[list[float]]
    infeasible: bool
    bound: Optional[float]
    time_s: float


def _run(model: ServingMilp, expr, sense: str, limit_s: float) -> _Run:
    h = model.h
    h.setOptionValue("time_limit", max(MIN_LIMIT_S, limit_s))
    t0 = time.perf_counter()
    if sense == "max":
        h.maximize(expr)
    else:
        h.minimize(expr)
    dt = time.perf_counter() - t0
    st = h.getModelStatus()
    info = h.getInfo()
    has = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    bound = float(info.mip_dual_bound) if math.isfinite(info.mip_dual_bound) else None
    infeasible = st in (highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnboundedOrInfeasible)
    return _Run(st == highspy.HighsModelStatus.kOptimal, list(h.getSolution().col_value) if has else None,
                infeasible, bound, dt)


def solve_mode(p: Problem, workers: list[Worker], mode: str, objective, rate: float,
               limit_s: float = 20.0, margins: Optional[Mapping[str, float]] = None) -> ModeResult:
    """Solve one mode at request rate ``rate`` (req/s; ignored by ``goodput``) within ``limit_s``
    seconds of HiGHS time (stage 2 gets what stage 1 left, at least :data:`MIN_LIMIT_S`);
    ``margins`` ``{role: m}``: each role must carry ``m x rate`` (the ``simulated`` cuts).

    Returns an infeasible :class:`ModeResult` with the conflicting keys when a role has no usable
    configuration (their per-configuration limits), or when the pools cannot hold the workers
    (``gpus[pool ...]`` with ``capacity[role]``); a time_limit one when HiGHS found no plan in time.
    """
    data = mode_data(p, workers, mode, rate, margins)
    t0 = time.perf_counter()
    for role in data.roles:
        if not any(w.role == role for w in data.workers):
            keys = tuple(c_worker.key(w, p) for w in data.unusable if w.role == role)
            details = tuple(c_worker.describe(k, data) for k in keys) or (_no_layout_reason(p, role),)
            return ModeResult(mode, Status.INFEASIBLE, None, None, None, time.perf_counter() - t0, rate, keys, details)
    model = build(data, objective)
    expr = objective.expr(model)
    first = _run(model, expr, objective.sense, limit_s)
    if first.solution is None:
        if not first.infeasible:
            return ModeResult(mode, Status.TIME_LIMIT, None, None, None, first.time_s, rate, solves=1)
        cut = tuple(c_simulated.key(r) for r in data.roles if data.margins.get(r, 1.0) > 1.0)
        keys = (tuple(c_gpus.key(pl.name) for pl in p.pools) + tuple(c_capacity.key(role) for role in data.roles)
                + cut + (tuple(c_homogeneous.key(role) for role in data.roles) if p.homogeneous else ()))
        details = tuple(c_gpus.describe(c_gpus.key(pl.name), data) for pl in p.pools)
        details += tuple(f"{role} capacity needed {rate * data.margins.get(role, 1.0):g} req/s; the best configuration on a whole pool carries at "
                         f"most {max(w.capacity(p.pools[w.pool].count // w.gpus) for w in data.workers if w.role == role):.3g}"
                         f" req/s" for role in data.roles)
        return ModeResult(mode, Status.INFEASIBLE, None, None, None, first.time_s, rate, keys, details, 1)
    value = model.value(expr)
    # stage 2: keep the objective, take the most headroom (or, for goodput, the fewest GPUs)
    c_objective.define(model, data, objective, value)
    if objective.sense == "max":
        second = _run(model, model.gpus, "min", limit_s - first.time_s)
    else:
        head = sum(c_pooling.carried(model, data, role) for role in data.roles) * (1.0 / max(rate, 1e-12))
        second = _run(model, head - 1e-6 * model.gpus, "max", limit_s - first.time_s)
    solution = second.solution if second.solution is not None else first.solution  # else stage 1's plan
    counts = {}
    for j, v in zip(data.index, model.x):
        n = int(round(solution[v.index]))
        if n:
            counts[j] = n
    goodput = objective.sense == "max"
    value_out = float(solution[model.rate.index]) if goodput else value
    bound = first.bound if first.bound is not None else value_out
    proven = first.proven and second.proven
    return ModeResult(mode, Status.OPTIMAL if proven else Status.FEASIBLE, counts, value_out, bound,
                      first.time_s + second.time_s, value_out if goodput else rate, solves=2)


def plan_value(p: Problem, workers: list[Worker], mode: str, objective, counts: dict[int, int],
               rate: float) -> Optional[float]:
    """The objective's value (its unit) of the fixed plan ``counts`` at ``rate`` req/s: the MILP
    with every count fixed, so the objective is evaluated by the same expression it is optimised
    with; None when the plan breaks a row (it does not carry the rate, or does not fit the pools)."""
    data = mode_data(p, workers, mode, rate)
    if any(j not in data.index for j in counts):
        return None
    model = build(data, objective)
    for j, v in zip(data.index, model.x):
        n = float(counts.get(j, 0))
        model.h.changeColBounds(v.index, n, n)
    expr = objective.expr(model)
    run = _run(model, expr, objective.sense, 1.0)
    return model.value(expr) if run.solution is not None else None


def _no_layout_reason(p, role: str) -> str:
    """Why a role has no worker configuration at all (the layout rules it fails)."""
    r = p.roles[role]
    m = p.model
    asked = f"serving.{role}.tp allows {list(r.tp)}" if r.tp is not None else "every TP degree was tried"
    cap = f", at most {r.max_gpus} GPUs" if r.max_gpus else ""
    return (f"no valid {role} layout: {asked}{cap}; TP must split the {m.q_heads} attention heads and "
            f"{m.kv_heads} KV heads evenly and fit one server of the pools")
