"""Day plan ("load over time", issue #27 item 2): one MILP over the windows of a day, HiGHS through highspy.

Decision space: configurations x windows. ``n[j,w]`` integer >= 0, the workers of configuration j
(pool x layout x role, :class:`~optimizer.serving.perf.Worker`) up in window w; ``s[j,w]`` integer
>= 0, those started at its start. Rows (families of ``constraints/serving/``, named by
:class:`~optimizer.result.ConstraintKey`): ``capacity[window w, role]`` (:mod:`~constraints.serving.day_capacity`),
``deploy[window w, role]``, ``gpus[window w, pool p]``, ``startup[window w, n[j]]``,
``uptime[window w, n[j]]`` and, for the static plan it is compared with, ``static[window w, n[j]]``.
Objective (``objectives/serving/``: ``gpus`` reads ``model.gpus``, ``dollars`` ``model.dollars``):

    GPU-hours = Σ_{j,w} g_j·n_{j,w}·len_w/3600 + Σ_{j,w} g_j·load_j/3600·s_{j,w}
    dollars   = the same with each term times the pool's $/GPU-hour

Queueing assumption, per window: each window is in steady state at its rate (the M/G/c prompt
queue and Little's-law decode batch of :mod:`optimizer.serving.perf`, with the window's own lengths
mix: one :class:`~optimizer.serving.perf.ServingModel` per window, so ``r[j,w]`` depends on w).
Warm windows: a window's workers serve only that window's arrivals; a request arriving near a
window's end is not handed to the next window's workers, and workers stopped at a boundary drain
nothing (the simulation of each window starts empty and runs its own arrivals to completion).

After each solve every window's plan is simulated (:func:`optimizer.serving.simulate.simulate`) on
that window's arrivals (its trace slice replayed unscaled, or Poisson at its rate); a window whose
simulated attainment misses the target gets its capacity requirement raised (the cut ``R_w·m_w``,
``m_w`` the next of :data:`MARGINS`) and the whole MILP is solved again, until every window meets
the target or the GPUs run out (infeasible: the window that cannot be served and the best
attainment it reached). Cuts change the problem solved: the plan is then ``feasible`` (proven
optimal only for the margined rates) and ``analytic_bound`` is the first solve's bound.

Not modelled: a mode switch during the day (each mode is planned for the whole day, the cheaper
reported), hand-over of queued requests between windows, start-ups overlapping the previous window.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import highspy

from constraints.serving import day_capacity, day_deploy, day_gpus, static, startup, uptime
from optimizer.budget import Budget, ProgressSink, no_progress
from optimizer.highs import new_highs
from optimizer.result import ConstraintKey, Status, relative_gap
from optimizer.serving.perf import ServingModel, Worker
from optimizer.serving.schema import Problem
from optimizer.serving.simulate import SimResult, SimulationCut, simulate

MODE_ROLES = {"aggregated": ("aggregated",), "disaggregated": ("prefill", "decode")}
ROW_FAMILIES = (day_capacity, day_deploy, day_gpus, startup, uptime, static)
MARGINS = (1.0, 1.1, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)  # a window's capacity factors after simulated misses
SOLVE_LIMIT_S = 20.0  # one MILP's HiGHS time limit without --time-limit (s)
MIN_LIMIT_S = 0.1
MODEL_SHARE = 0.4  # of the time limit, at most, for the window models (window_workers)
MIP_REL_GAP = 1e-4  # HiGHS mip_rel_gap (its default, stated)


@dataclass(frozen=True)
class DayData:
    """The input of one mode's day MILP.

    Attributes:
        problem: the serving problem (pools, prices, windows, startup).
        mode: ``aggregated`` or ``disaggregated``; roles: its roles.
        windows: the windows (:class:`~optimizer.serving.windows.Window`).
        labels: each configuration's label (usable in at least one window), the columns' names.
        index: each configuration's index in every window's worker list (the same layouts).
        roles_of, pool_of, gpus, load_s: each configuration's role, pool index, GPUs per worker and
            start-up seconds.
        rates: ``rates[j][w]``: configuration j's rate in window w (req/s, 0: unusable there).
        required: each window's capacity requirement ``R_w·m_w`` (req/s).
        margins: each window's ``m_w``.
        static: add the ``static`` rows (one set of workers all day).
    """

    problem: Problem
    mode: str
    roles: tuple[str, ...]
    windows: tuple
    labels: tuple[str, ...]
    index: tuple[int, ...]
    roles_of: tuple[str, ...]
    pool_of: tuple[int, ...]
    gpus: tuple[int, ...]
    load_s: tuple[float, ...]
    rates: tuple[tuple[float, ...], ...]
    required: tuple[float, ...]
    margins: tuple[float, ...]
    static: bool = False


def day_data(p: Problem, workers: list[list[Worker]], mode: str, margins=None, static_plan: bool = False) -> DayData:
    """The :class:`DayData` of ``mode`` over the per-window worker lists ``workers[w]`` (all from
    the same layouts, in the same order)."""
    roles = MODE_ROLES[mode]
    wins = p.windows
    margins = tuple(margins) if margins is not None else (1.0,) * len(wins)
    first = workers[0]
    idx = tuple(j for j, w in enumerate(first) if w.role in roles and any(ws[j].rate > 0 for ws in workers))
    su = p.startup
    load = tuple(su.load_s_of(p.pools[first[j].pool].perf, first[j].layout) if su is not None else 0.0 for j in idx)
    return DayData(p, mode, roles, wins, tuple(first[j].label(p) for j in idx), idx,
                   tuple(first[j].role for j in idx), tuple(first[j].pool for j in idx),
                   tuple(first[j].gpus for j in idx), load,
                   tuple(tuple(ws[j].rate for ws in workers) for j in idx),
                   tuple(win.rate * m for win, m in zip(wins, margins)), margins, static_plan)


class DayMilp:
    """One mode's day MILP on a ``highspy.Highs`` instance.

    Attributes:
        x: ``x[j][w]`` = n_{j,w} (integer columns ``n[<label>]@w<k>``); s: ``s[j][w]`` the starts.
        gpus: the GPU-hours expression; dollars: the dollars expression (see module docstring).
        rows: ``{row name: ConstraintKey}``.
    """

    def __init__(self, data: DayData):
        self.h = h = new_highs()
        h.setOptionValue("mip_rel_gap", MIP_REL_GAP)
        p = data.problem
        nw = len(data.windows)
        self.x = [[h.addIntegral(lb=0, name=f"n[{lab}]@w{w + 1}") for w in range(nw)] for lab in data.labels]
        self.s = [[h.addIntegral(lb=0, name=f"s[{lab}]@w{w + 1}") for w in range(nw)] for lab in data.labels]
        hours = [win.length_s / 3600.0 for win in data.windows]
        price = [p.pools[i].price or 0.0 for i in data.pool_of]
        up = [sum(data.gpus[j] * hours[w] * self.x[j][w] for w in range(nw)) for j in range(len(data.labels))]
        st = [sum(data.gpus[j] * data.load_s[j] / 3600.0 * self.s[j][w] for w in range(nw)) for j in range(len(data.labels))]
        self.gpus = sum(u + s for u, s in zip(up, st))
        self.dollars = sum(price[j] * (up[j] + st[j]) for j in range(len(data.labels)))
        self.rate = 0.0  # the objectives' goodput reads it; a day plan refuses goodput at load
        self.rows: dict[str, ConstraintKey] = {}

    def add(self, expr, key: ConstraintKey):
        self.rows[str(key)] = key
        return self.h.addConstr(expr, name=str(key))


def build(data: DayData) -> DayMilp:
    """The model: columns, every family's rows, no objective set yet."""
    model = DayMilp(data)
    for family in ROW_FAMILIES:
        family.define(model, data)
    return model


@dataclass(frozen=True)
class DayResult:
    """One solve of the day MILP.

    Attributes:
        status: optimal (HiGHS proved it within :data:`MIP_REL_GAP`), feasible, infeasible, time_limit.
        counts: ``counts[w]`` ``{worker index: n}`` per window (None without a plan); starts likewise.
        value, bound, gap: objective (its unit), HiGHS's ``mip_dual_bound``, relative gap.
        gpu_hours, dollars: the plan's (None without a plan); time_s: HiGHS wall time.
        conflict: the keys of what cannot be met when infeasible; details: in words.
    """

    status: Status
    counts: Optional[tuple[dict[int, int], ...]]
    starts: Optional[tuple[dict[int, int], ...]]
    value: Optional[float]
    bound: Optional[float]
    gap: Optional[float]
    gpu_hours: Optional[float]
    dollars: Optional[float]
    time_s: float
    conflict: tuple[ConstraintKey, ...] = ()
    details: tuple[str, ...] = ()


def solve_day(data: DayData, objective, limit_s: float) -> DayResult:
    """Solve the day MILP of ``data`` within ``limit_s`` seconds of HiGHS time."""
    for w, win in enumerate(data.windows):  # a role with no usable configuration in a served window
        if win.rate <= 0:
            continue
        for role in data.roles:
            if not any(data.rates[j][w] > 0 for j in range(len(data.labels)) if data.roles_of[j] == role):
                k = day_capacity.key(w, role)
                return DayResult(Status.INFEASIBLE, None, None, None, None, None, None, None, 0.0, (k,),
                                 (f"no {role} configuration meets the SLOs under {win.name}'s lengths mix",))
    model = build(data)
    h = model.h
    h.setOptionValue("time_limit", max(MIN_LIMIT_S, limit_s))
    expr = objective.expr(model)
    t0 = time.perf_counter()
    h.minimize(expr)
    dt = time.perf_counter() - t0
    st = h.getModelStatus()
    info = h.getInfo()
    has = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    if not has:
        if st in (highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnboundedOrInfeasible):
            keys, details = infeasible_windows(data)
            return DayResult(Status.INFEASIBLE, None, None, None, None, None, None, None, dt, keys, details)
        return DayResult(Status.TIME_LIMIT, None, None, None, None, None, None, None, dt)
    sol = h.getSolution().col_value
    nw = len(data.windows)
    counts = tuple({data.index[j]: int(round(sol[model.x[j][w].index])) for j in range(len(data.labels))
                    if round(sol[model.x[j][w].index])} for w in range(nw))
    starts = tuple({data.index[j]: int(round(sol[model.s[j][w].index])) for j in range(len(data.labels))
                    if round(sol[model.s[j][w].index])} for w in range(nw))
    value = float(h.val(expr))
    bound = float(info.mip_dual_bound) if math.isfinite(info.mip_dual_bound) else value
    bound = min(bound, value)
    gpu_hours = plan_cost(data, counts, starts, dollars=False)
    dollars = plan_cost(data, counts, starts, dollars=True)
    status = Status.OPTIMAL if st == highspy.HighsModelStatus.kOptimal else Status.FEASIBLE
    return DayResult(status, counts, starts, value, bound, relative_gap(value, bound), gpu_hours,
                     dollars if all(pl.price is not None for pl in data.problem.pools) else None, dt)


def plan_cost(data: DayData, counts, starts, dollars: bool = False) -> float:
    """GPU-hours (or dollars) of a schedule, from the counts themselves (the objective's formula)."""
    p = data.problem
    where = {j: k for k, j in enumerate(data.index)}
    total = 0.0
    for w, win in enumerate(data.windows):
        for j, n in counts[w].items():
            k = where[j]
            f = (p.pools[data.pool_of[k]].price or 0.0) if dollars else 1.0
            total += f * data.gpus[k] * n * win.length_s / 3600.0
        for j, n in starts[w].items():
            k = where[j]
            f = (p.pools[data.pool_of[k]].price or 0.0) if dollars else 1.0
            total += f * data.gpus[k] * data.load_s[k] / 3600.0 * n
    return total


def infeasible_windows(data: DayData) -> tuple[tuple[ConstraintKey, ...], tuple[str, ...]]:
    """The windows whose capacity requirement no set of workers on the pools can carry (LP bound of
    each window alone: every pool filled with its best rate per GPU); else the start-up coupling."""
    keys, details = [], []
    p = data.problem
    for w, win in enumerate(data.windows):
        if win.rate <= 0:
            continue
        for role in data.roles:
            best = 0.0
            for i, pool in enumerate(p.pools):
                on = [j for j in range(len(data.labels)) if data.roles_of[j] == role and data.pool_of[j] == i]
                best += max(((pool.count // data.gpus[j]) * data.rates[j][w] for j in on), default=0.0)
            if best < data.required[w]:
                keys.append(day_capacity.key(w, role))
                details.append(f"{win.name} needs {data.required[w]:.3g} req/s of {role} capacity (rate "
                               f"{win.rate:.3g} x margin {data.margins[w]:g}); the pools carry at most {best:.3g}")
    if not keys:
        keys = [day_gpus.key(w, pl.name) for w in range(len(data.windows)) for pl in p.pools]
        details = ["every window alone fits the pools; the start-up and up-time rows together do not"]
    return tuple(keys), tuple(details)


# ----------------------------------------------------------------------------- simulation loop
@dataclass(frozen=True)
class WindowSim:
    """One window's simulation: attainment (None: nothing to simulate), the figures, and a note."""

    attainment: Optional[float]
    sim: Optional[SimResult] = None
    note: str = ""


def simulate_window(p: Problem, workers: list[Worker], counts: dict[int, int], mode: str, win,
                    deadline: Optional[float] = None) -> WindowSim:
    """Simulate window ``win``'s plan ``counts`` on its own arrivals (see the module docstring)."""
    if win.rate <= 0 or not counts:
        return WindowSim(None, note="no requests")
    tr = win.traffic
    pw = replace(p, traffic=tr, rates=(win.rate,))
    try:
        if tr.arrivals is not None:
            k = len(tr.arrivals)
            if k < 2 or tr.arrivals[-1] <= 0:
                return WindowSim(None, note=f"{k} request(s): nothing to simulate")
            own = (k - 1) / tr.arrivals[-1]  # simulate() scales a trace to the rate asked: this keeps it
            sim = simulate(pw, workers, counts, mode, own, requests=k, deadline=deadline)
        else:
            sim = simulate(pw, workers, counts, mode, win.rate, deadline=deadline)
    except SimulationCut as cut:
        return WindowSim(None, note=f"simulation cut by the time limit ({cut})")
    return WindowSim(sim.attainment, sim)


@dataclass(frozen=True)
class ModeDay:
    """One mode's day plan after the simulation loop.

    Attributes:
        mode: the mode; result: the last MILP's :class:`DayResult`; first: the first one's (margins 1).
        data: the last MILP's data (margins); sims: each window's :class:`WindowSim` of the plan.
        static: the static plan's result (same margins, ``static`` rows), None when not solved.
        iterations: MILP solves of the loop; ok: every window meets the target in simulation.
        failed: the windows (0-based) still below target; best: each window's best attainment seen.
        why: one line when there is no accepted plan.
    """

    mode: str
    result: DayResult
    first: DayResult
    data: DayData
    sims: tuple[WindowSim, ...] = ()
    static: Optional[DayResult] = None
    iterations: int = 1
    ok: bool = False
    failed: tuple[int, ...] = ()
    best: tuple[Optional[float], ...] = ()
    why: str = ""
    time_s: float = 0.0

    @property
    def status(self) -> Status:
        if self.result.counts is None:
            return self.result.status
        if not self.ok:
            return Status.INFEASIBLE
        cut = any(m > 1.0 for m in self.data.margins) or bool(self.unchecked)
        return Status.FEASIBLE if cut else self.result.status

    @property
    def unchecked(self) -> tuple[int, ...]:
        """Windows whose simulation the time limit cut: their SLO is not checked, so the plan is
        not claimed optimal (its MILP value is, over the plans it priced)."""
        return tuple(w for w, s in enumerate(self.sims) if s.note.startswith("simulation cut"))


def plan_day_mode(p: Problem, workers: list[list[Worker]], mode: str, objective, budget: Budget,
                  do_sim: bool = True) -> ModeDay:
    """Solve ``mode``'s day MILP, simulate every window, cut the windows that miss the target and
    re-solve until all meet it (see the module docstring); then the static plan at the same margins."""
    t0 = time.perf_counter()
    nw = len(p.windows)
    level = [0] * nw
    best: list[Optional[float]] = [None] * nw
    cache: dict = {}
    first = None
    it = 0
    last_ok: Optional[tuple[DayData, DayResult, tuple]] = None
    while True:
        data = day_data(p, workers, mode, [MARGINS[k] for k in level])
        res = solve_day(data, objective, _limit_s(budget))
        it += 1
        first = first or res
        if res.counts is None:
            why = ("the GPUs run out: " if it > 1 else "") + "; ".join(res.details or (res.status.value,))
            failed = tuple(sorted({int(k.element.split(",")[0].split()[1]) - 1 for k in res.conflict
                                   if k.element.startswith("window")}))
            return ModeDay(mode, res, first, data, last_ok[2] if last_ok else (), None, it, False, failed,
                           tuple(best), why, time.perf_counter() - t0)
        if not do_sim:
            sims = tuple(WindowSim(None, note="simulation off") for _ in range(nw))
            break
        sims = []
        for w, win in enumerate(p.windows):
            key = (w, tuple(sorted(res.counts[w].items())))
            if key not in cache:
                cache[key] = simulate_window(p, workers[w], res.counts[w], mode, win, budget.deadline)
            sims.append(cache[key])
            a = cache[key].attainment
            if a is not None and (best[w] is None or a > best[w]):
                best[w] = a
        sims = tuple(sims)
        last_ok = (data, res, sims)
        failing = [w for w, s in enumerate(sims) if s.attainment is not None and s.attainment < p.attainment]
        if not failing:
            break
        stuck = [w for w in failing if level[w] == len(MARGINS) - 1]
        if stuck or budget.expired():
            why = (f"{', '.join(p.windows[w].name for w in failing)}: simulated attainment below "
                   f"{p.attainment:g} " + (f"even at capacity margin {MARGINS[-1]:g}" if stuck else
                                          "when the time limit ran out"))
            return ModeDay(mode, res, first, data, sims, None, it, False, tuple(failing), tuple(best), why,
                           time.perf_counter() - t0)
        for w in failing:
            level[w] += 1
    st = solve_day(replace(data, static=True), objective, _limit_s(budget))
    return ModeDay(mode, res, first, data, sims, st, it, True, (), tuple(best), "", time.perf_counter() - t0)


def _limit_s(budget: Budget) -> float:
    limit = SOLVE_LIMIT_S if budget.limit_s is None else budget.limit_s
    return max(MIN_LIMIT_S, min(limit, budget.remaining_s()))


@dataclass(frozen=True)
class DaySolution:
    """The day plan of every mode asked; ``best`` the cheaper accepted one.

    Attributes:
        problem: the problem; objective: the objective object; workers: ``workers[w]`` per window.
        modes: ``{mode: ModeDay}``; time_s: wall time of the whole solve (models, MILPs, simulations);
        model_s: the per-window ServingModels' time (s).
    """

    problem: Problem
    objective: Any
    workers: tuple
    modes: dict
    time_s: float
    model_s: float = 0.0
    distinct_mixes: int = 0
    pooled_windows: int = 0

    @property
    def best(self) -> Optional[ModeDay]:
        ok = [m for m in self.modes.values() if m.ok]
        return min(ok, key=lambda m: m.result.value) if ok else None

    @property
    def status(self) -> Status:
        b = self.best
        if b is not None:  # windows sized with the day's mix: the MILP's optimum is over other numbers
            return Status.FEASIBLE if self.pooled_windows and b.status == Status.OPTIMAL else b.status
        if any(m.result.status == Status.TIME_LIMIT for m in self.modes.values()):
            return Status.TIME_LIMIT
        return Status.INFEASIBLE


def window_workers(p: Problem, roles, deadline: Optional[float] = None) -> tuple[tuple, int, int]:
    """Every window's configurations (one :class:`ServingModel` per distinct lengths mix; a window
    without requests takes the first window's), the number of distinct mixes and the number of
    windows that take the whole day's mix instead of their own.

    ``deadline`` (``time.perf_counter()`` seconds, None: none) bounds the modelling: once it
    passes, the windows not yet modelled take the whole day's lengths mix (``p.traffic``, one
    model more); their rates, MILP rows and simulated arrivals stay their own, so the SLO check
    is unchanged but their sizing is approximate and the plan is not claimed optimal.
    """
    by_mix: dict = {}
    out = []
    pooled = 0
    whole = None
    for win in p.windows:
        tr = win.traffic
        key = (tr.isl.tobytes(), tr.osl.tobytes(), tr.weight.tobytes())
        if key not in by_mix and deadline is not None and time.perf_counter() >= deadline:
            if whole is None:
                whole = tuple(ServingModel(replace(p, rates=(max(win.rate, 1e-9),))).workers(roles))
            out.append(whole)
            pooled += 1
            continue
        if key not in by_mix:
            by_mix[key] = tuple(ServingModel(replace(p, traffic=tr, rates=(max(win.rate, 1e-9),))).workers(roles))
        out.append(by_mix[key])
    labels = [w.label(p) for w in out[0]]
    for ws in out[1:]:  # the layouts do not depend on the traffic: same configurations in the same order
        assert [w.label(p) for w in ws] == labels
    return tuple(out), len(by_mix) + (whole is not None), pooled


def solve_day_problem(p: Problem, budget: Budget, progress: ProgressSink = no_progress,
                      simulate_plans: Optional[bool] = None) -> DaySolution:
    """Every mode asked: its day plan (:func:`plan_day_mode`), within ``budget`` (an equal share each)."""
    from objectives.serving import registry

    t0 = time.perf_counter()
    objective = registry()[p.objective]
    modes = ("aggregated", "disaggregated") if p.mode == "both" else (p.mode,)
    # the window models take at most MODEL_SHARE of the budget (very short windows each have
    # their own mix: 1,168 three-second windows of a trace are ~200 s of modelling on 2 cores)
    model_deadline = None if budget.deadline is None else \
        time.perf_counter() + MODEL_SHARE * budget.remaining_s()
    workers, mixes, pooled = window_workers(p, tuple(r for m in modes for r in MODE_ROLES[m]), model_deadline)
    model_s = time.perf_counter() - t0
    if pooled:
        budget.note_cut(f"window models: {pooled} of {len(p.windows)} windows sized with the whole day's lengths "
                        f"mix, not their own (modelling each took more than {MODEL_SHARE:.0%} of the time limit)")
    do_sim = p.simulation.enabled if simulate_plans is None else simulate_plans
    out = {}
    for k, m in enumerate(modes):
        md = plan_day_mode(p, [list(ws) for ws in workers], m, objective, budget.split(1.0 / (len(modes) - k)), do_sim)
        out[m] = md
        r = md.result
        progress({"elapsed_s": budget.elapsed_s(), "method": f"highs day plan {m} ({md.iterations} solves)",
                  "value": r.value, "bound": r.bound, "gap": r.gap})
    return DaySolution(p, objective, workers, out, time.perf_counter() - t0, model_s, mixes, pooled)
