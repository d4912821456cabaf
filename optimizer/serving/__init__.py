"""Serving capacity planning: requests at R per second with ISL/OSL tokens, TTFT/TPOT targets at a
percentile and an attainment; the cheapest set of workers, aggregated (continuous batching with
chunked prefill) or disaggregated (prefill and decode pools with the KV moved between them).

Pipeline (:data:`PIPELINE`, the protocol of :mod:`optimizer.problems`): ``load`` (:mod:`.schema`:
strict input, traffic, units) -> ``build`` (:mod:`.perf`: every worker configuration's largest
rate within the SLOs, on the shared model :mod:`optimizer.model`; :mod:`.solve`: one MILP per
mode on HiGHS through highspy, rows named by the families of ``constraints/serving/``, objectives
in ``objectives/serving/``) -> ``solve`` (every (rate, mode) within the budget; :mod:`.simulate`,
the independent SimPy evaluator, checks each plan: one below the attainment target is re-solved
with more capacity, never returned; with ``serving.traffic.windows`` or ``window_min`` the day plan
of :mod:`.dayplan` instead, reported by :mod:`.dayreport`) -> ``explain`` (:mod:`.explain`: binding limits, why the
other mode lost, conflicts, the best achievable when infeasible) -> ``report`` (:mod:`.report`:
result envelope, tables, launch scripts from :mod:`.launch`).
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from objectives.serving import registry as objective_registry
from optimizer.budget import Budget, ProgressSink, no_progress
from optimizer.result import Status
from optimizer.serving.bursts import fluid_margin
from optimizer.serving.explain import ServingExplanation, best_achievable_slo, explain
from optimizer.serving.perf import ServingModel
from optimizer.serving.report import ServingReport
from optimizer.serving.schema import Problem, load
from optimizer.serving.simulate import SimResult, SimulationCut, simulate
from optimizer.serving.solution import NOT_BEGUN, ModePlan, RateResult, ServingSolution
from optimizer.errors import InputError, warn_input
from optimizer.serving.solve import MODE_ROLES, ModeResult, ServingMilp, build, mode_data, plan_value, solve_mode

__all__ = ["PIPELINE", "ServingPipeline", "load_problem", "solve_instance", "solve_problem", "best_achievable_slo",
           "ServingReport", "ServingSolution", "ServingExplanation", "plan_mode"]

MARGINS = (1.0, 1.1, 1.25, 1.5, 2.0)  # capacity factors tried after a simulation below the attainment target
# closed loop whose sizing rate has no open-loop plan: smaller sizings tried, each simulated as the
# closed loop itself (the users slow down with the plan, so the open-loop MILP is not a limit)
CLOSED_LOOP_BELOW = (0.8, 0.6, 0.45, 0.3)
# closed loop: the first wave of N prompts may need far more prefill than the users' mean rate, so
# capacity grows further than an open loop's before the search gives up
CLOSED_LOOP_MARGINS = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
SOLVE_LIMIT_S = 20.0  # one MILP's HiGHS time limit without --time-limit (s)
MIN_SOLVE_S = 0.05  # the least time a solve is given once the budget is nearly spent (s)


def closed_loop_rates(p: Problem) -> Problem:
    """Closed-loop traffic for the optimiser: ``N`` users generate at least ``N / (TTFT + (OSL - 1)·TPOT)``
    requests/s while every request takes its SLO's time (Little's law at the targets, mean OSL), the
    rate the MILP sizes for; each plan is then checked by simulating the closed loop itself and gets
    more capacity while that misses the attainment (:func:`plan_mode`). No optimality claim: the
    open-loop MILP at that rate is neither a relaxation nor a restriction of the closed loop, so a
    closed-loop plan is ``feasible`` without a bound.

    Raises:
        InputError: concurrency with a maximising objective (goodput: the users set the rate), or
            with the simulation disabled (a closed loop is checked by simulation only).
    """
    if p.concurrency is None:
        return p
    if not p.simulation.enabled:
        raise InputError(p.path, "serving.simulation.enabled", "closed-loop traffic (concurrency) is checked by "
                                                               "simulating it: the optimiser needs the simulation")
    if objective_registry()[p.objective].sense == "max":
        raise InputError(p.path, "serving.traffic.concurrency", f"objective {p.objective} maximises the rate, which "
                                                                f"closed-loop users set themselves: use gpus or dollars")
    rate = p.concurrency / (p.ttft_s + (p.traffic.mean_osl - 1.0) * p.tpot_s)
    return replace(p, rates=(rate,))


def load_problem(raw: dict[str, Any], path: str | Path, objective: str | None = None) -> Problem:
    """The validated problem of a raw instance (units converted).

    Raises:
        InputError: bad input (one line naming file, field and problem).
    """
    return load(raw, path, objective, objective_registry())


def _solve_limit_s(budget: Budget) -> float:
    """One MILP's HiGHS time limit (s): the command's limit (else :data:`SOLVE_LIMIT_S`), never
    past the budget's deadline (at least :data:`MIN_SOLVE_S`)."""
    limit = SOLVE_LIMIT_S if budget.limit_s is None else budget.limit_s
    return max(MIN_SOLVE_S, min(limit, budget.remaining_s()))


def _with_margin(res: ModeResult, first: Optional[ModeResult], margin: float) -> ModeResult:
    """A plan accepted only with extra capacity is no longer proven optimal for the rate asked:
    status feasible, bound = the analytic optimum at margin 1 (a bound under the analytic model)."""
    if margin <= 1.0:
        return res
    bound = first.bound if first is not None and first.bound is not None else res.bound
    return replace(res, status=Status.FEASIBLE, bound=bound)


def _closed_loop_claim(plan: ModePlan) -> ModePlan:
    """A closed-loop plan claims no optimum and no bound (:func:`closed_loop_rates`)."""
    if plan.result.counts is None:
        return plan
    return replace(plan, result=replace(plan.result, status=Status.FEASIBLE, bound=None))


def plan_mode(p: Problem, workers, mode: str, objective, rate: float, budget: Budget, do_sim: bool) -> ModePlan:
    """Solve one mode at ``rate`` req/s, then check it in simulation; on a miss re-solve with
    ``MARGINS`` more capacity (goodput: report a lower rate for the same plan) until the simulated
    attainment meets the target.

    ``budget``: each solve's HiGHS limit is :func:`_solve_limit_s`; a simulation still running at
    its deadline is abandoned and the plan returned on the analytic model's checks alone, with
    ``sim_cut`` set (the report says so)."""
    try:
        plan = _plan_mode_checked(p, workers, mode, objective, rate, budget, do_sim)
    except SimulationCut as cut:
        plan, why = cut.args
        plan = replace(plan, sim_cut=why)
    return _closed_loop_claim(plan) if p.concurrency is not None else plan


def _plan_mode_checked(p, workers, mode, objective, rate, budget: Budget, do_sim: bool) -> ModePlan:
    if do_sim and objective.sense == "min" and p.concurrency is None:
        return _size_on_simulation(p, workers, mode, objective, rate, budget)
    goodput = objective.sense == "max"
    first = None

    def checked(res: ModeResult, served: float, margin: float) -> tuple[ModeResult, SimResult]:
        """``res`` at ``served`` req/s (goodput: its value is the rate served) and its simulation."""
        res = replace(res, value=served) if goodput and margin > 1.0 else res
        try:
            return res, simulate(p, workers, res.counts, mode, served, deadline=budget.deadline,
                                 concurrency=p.concurrency)
        except SimulationCut as cut:
            raise SimulationCut(ModePlan(mode, _with_margin(res, first, margin), rate=served, margin=margin),
                                str(cut)) from None

    failed = None
    for margin in (MARGINS if p.concurrency is None else CLOSED_LOOP_MARGINS):
        res = solve_mode(p, workers, mode, objective, rate * margin, _solve_limit_s(budget))
        if first is None:
            first = res
        if res.counts is None:
            if margin == 1.0:
                if p.concurrency is not None and do_sim:
                    return _closed_loop_below(p, workers, mode, objective, rate, budget, res, checked)
                return ModePlan(mode, res)
            break
        served = res.rate / margin if goodput else rate
        if goodput:
            res = replace(res, value=served)
        if not do_sim:
            return ModePlan(mode, res, rate=served, margin=margin)
        res, sim = checked(res, served, margin)
        if sim.attainment >= p.attainment:  # a closed loop's claim: plan_mode (_closed_loop_claim)
            return ModePlan(mode, _with_margin(res, first, margin), sim, served, margin)
        failed = ModePlan(mode, res, sim, served, margin, sim_failed=True)  # unless a later margin passes
        if goodput:  # same plan, lower rate
            for m2 in MARGINS[1:]:
                served = res.rate / m2
                res2, sim = checked(res, served, m2)
                if sim.attainment >= p.attainment:
                    return ModePlan(mode, _with_margin(replace(res2, value=served), first, m2), sim, served, m2)
            break
    return failed


def _closed_loop_below(p: Problem, workers, mode: str, objective, rate: float, budget: Budget, first: ModeResult,
                       checked) -> ModePlan:
    """A closed loop whose sizing rate ``rate`` has no open-loop plan (``first``): plans sized for
    :data:`CLOSED_LOOP_BELOW` times the rate, largest first, each simulated as the closed loop; the
    first that meets the attainment is the plan (``feasible``, no bound). None: ``first`` with the
    misses added to its details (the solution's status is then ``not_found``, not a proof)."""
    tried = []
    for m in CLOSED_LOOP_BELOW:
        if budget.expired():
            break
        res = solve_mode(p, workers, mode, objective, rate * m, _solve_limit_s(budget))
        if res.counts is None:
            continue
        res, sim = checked(res, rate, m)
        if sim.attainment >= p.attainment:
            return ModePlan(mode, res, sim, rate, m)
        tried.append(f"closed loop: the plan sized for {m:g} x {rate:.4g} req/s ({res.value:g} {objective.unit}) "
                     f"simulated {sim.attainment:.1%} on time (target {p.attainment:.0%})")
    return ModePlan(mode, replace(first, details=tuple(first.details) + tuple(tried)))


def start_margins(p: Problem, mode: str, rate: float) -> dict[str, float]:
    """Where the capacity search starts, ``{role: m}``: for a trace, the role that takes the
    prompts (prefill or aggregated) starts at :func:`~optimizer.serving.bursts.fluid_margin` of
    the trace's own arrivals at ``rate`` (their q-quantile pooled wait within the TTFT target,
    :attr:`Problem.quantile`); Poisson arrivals start at 1."""
    tr = p.traffic
    if tr.arrivals is None or len(tr.arrivals) < 2:
        return {}
    own = (len(tr.arrivals) - 1) / max(float(tr.arrivals[-1]), 1e-12)
    m = fluid_margin(tr.arrivals * (own / rate), tr.trace_isl, rate, p.ttft_s, p.quantile)
    return {MODE_ROLES[mode][0]: m} if m > 1.0 else {}


def _growth(shortfall: float) -> float:
    """Capacity factor for the next round after a simulated attainment ``shortfall`` below target."""
    return 1.1 if shortfall <= 0.02 else 1.25 if shortfall <= 0.1 else 1.5 if shortfall <= 0.3 else 2.0


def _grow(p: Problem, mode: str, margins: dict[str, float], sim: SimResult) -> dict[str, float]:
    """The next round's margins after ``sim`` missed: aggregated workers grow with the joint
    shortfall; disaggregated, prefill with the TTFT-only shortfall and decode with the TPOT-only one
    (and, when each alone passes but not both, the lower of the two by the joint shortfall)."""
    out = dict(margins)
    if mode == "aggregated":
        out["aggregated"] = out.get("aggregated", 1.0) * _growth(p.attainment - sim.attainment)
        return out
    miss = {"prefill": p.attainment - sim.ttft_attainment, "decode": p.attainment - sim.tpot_attainment}
    grown = False
    for role, short in miss.items():
        if short > 0:
            out[role] = out.get(role, 1.0) * _growth(short)
            grown = True
    if not grown:
        role = max(miss, key=miss.get)
        out[role] = out.get(role, 1.0) * _growth(p.attainment - sim.attainment)
    return out


MAX_ROUNDS = 24  # capacity rounds of one (rate, mode) before it answers with what it has
REFINE_ROUNDS = 4  # bisection rounds between the last failing and the first passing margins


def _size_on_simulation(p: Problem, workers, mode: str, objective, rate: float, budget: Budget) -> ModePlan:
    """The cheapest plan found whose simulated attainment meets the target, sizing on the
    simulation itself (the trace replayed, or the seeded Poisson stream).

    Rounds: solve the MILP with the ``simulated`` cuts ``{role: m}`` (:func:`start_margins` at first),
    simulate, and on a miss raise the missing roles' margins by the shortfall (:func:`_grow`)
    until a plan passes, or the MILP has no plan (the GPUs run out). Then: when a plan passed
    after a miss, bisect the margins between the last miss and the pass (:data:`REFINE_ROUNDS`)
    for a cheaper passing plan; when the GPUs ran out first, simulate the most capacity they hold
    (the largest feasible margins on the line to the infeasible ones, and the goodput plan, the
    most rate every role carries on the pools). Infeasible only when none of them passes, with
    the best attainment reached and its GPUs.

    A plan solved with margins > 1 is ``feasible`` with bound = the MILP's optimum without them
    (a bound under the analytic model); with none it keeps the MILP's status."""
    limit = _solve_limit_s

    def solve(margins):
        return solve_mode(p, workers, mode, objective, rate, limit(budget), margins)

    def plan_of(res, sim, margins, failed=False, exhausted=False):
        m = max(margins.values(), default=1.0)
        if m > 1.0 and not failed:
            res = replace(res, status=Status.FEASIBLE, bound=first.bound if first.bound is not None else res.bound)
        return ModePlan(mode, res, sim, rate, m, sim_failed=failed, role_margins=dict(margins), exhausted=exhausted)

    def run(res, margins):
        try:
            return simulate(p, workers, res.counts, mode, rate, deadline=budget.deadline)
        except SimulationCut as cut:
            raise SimulationCut(plan_of(res, None, margins), str(cut)) from None

    first = solve({})
    if first.counts is None:
        return ModePlan(mode, first)
    margins = start_margins(p, mode, rate)
    res = first if not margins else solve(margins)
    if res.counts is None:  # the trace's start asks more than the GPUs hold: search from 1
        margins, res = {}, first
    miss = None  # (margins, result) of the last miss
    best = None  # the passing plan
    worst = None  # the best attainment among the misses
    for _ in range(MAX_ROUNDS):
        sim = run(res, margins)
        if sim.attainment >= p.attainment:
            best = plan_of(res, sim, margins)
            break
        if worst is None or sim.attainment > worst.sim.attainment:
            worst = plan_of(res, sim, margins, failed=True)
        miss = (margins, res)
        if budget.expired():
            return worst
        nxt = _grow(p, mode, margins, sim)
        res2 = solve(nxt)
        if res2.counts is None:  # the GPUs run out: the most capacity on the way there, then goodput
            best, worst = _most_capacity(p, workers, mode, rate, budget, margins, nxt, worst, plan_of, run, solve)
            worst = replace(worst, exhausted=True)
            break
        margins, res = nxt, res2
    if best is None:
        return worst
    # cheaper passing plans between the last miss (or no margin) and the pass
    lo = miss[0] if miss is not None else {}
    hi = dict(best.role_margins)
    for _ in range(REFINE_ROUNDS):
        if budget.expired():
            break
        mid = {r: math.sqrt(lo.get(r, 1.0) * hi.get(r, 1.0)) for r in set(lo) | set(hi)}
        if all(abs(mid[r] / hi.get(r, 1.0) - 1.0) < 0.02 for r in mid):
            break
        res = solve(mid)
        if res.counts is None:
            lo = mid
            continue
        if res.value is not None and best.result.value is not None and res.value >= best.result.value - 1e-9:
            hi = mid  # no cheaper at this margin: look lower
            continue
        sim = run(res, mid)
        if sim.attainment >= p.attainment:
            best, hi = plan_of(res, sim, mid), mid
        else:
            lo = mid
    return best


def _most_capacity(p, workers, mode, rate, budget, ok_margins, bad_margins, worst, plan_of, run, solve):
    """When the MILP has no plan at ``bad_margins``: the largest feasible margins on the line from
    ``ok_margins`` (bisection on the MILP alone), the goodput plan (the most rate each role carries
    on the pools) and, aggregated, each configuration alone filling its pool, each simulated;
    the first that passes is returned. Returns ``(passing plan or None, best miss)``."""
    lo, hi = 0.0, 1.0
    roles = set(ok_margins) | set(bad_margins)

    def at(t):
        return {r: ok_margins.get(r, 1.0) ** (1 - t) * bad_margins.get(r, 1.0) ** t for r in roles}

    found = None
    for _ in range(8):
        mid = (lo + hi) / 2
        res = solve(at(mid))
        if res.counts is None:
            hi = mid
        else:
            lo, found = mid, (at(mid), res)
    candidates = [found] if found is not None else []
    g = solve_mode(p, workers, mode, objective_registry()["goodput"], rate, _solve_limit_s(budget))
    if g.counts is not None:
        cap = g.rate / max(rate, 1e-12)
        candidates.append(({r: cap for r in MODE_ROLES[mode]}, replace(g, value=None)))
    if mode == "aggregated":  # each configuration alone on the whole pool: the widest plans of one kind
        for j, w in enumerate(workers):
            n = p.pools[w.pool].count // w.gpus
            if w.role == "aggregated" and w.rate > 0 and n > 0:
                res = ModeResult(mode, Status.FEASIBLE, {j: n}, None, None, 0.0, rate)
                candidates.append(({"aggregated": n * w.rate / max(rate, 1e-12)}, res))
    for margins, res in candidates:
        if budget.expired():
            break
        if res.value is None:  # the goodput plan, or one configuration alone: its objective in the problem's unit
            value = plan_value(p, workers, mode, objective_registry()[p.objective], res.counts, rate)
            if value is None:  # it does not carry the rate even analytically
                continue
            res = replace(res, value=value, bound=None, status=Status.FEASIBLE)
        sim = run(res, margins)
        plan = plan_of(res, sim, margins, failed=sim.attainment < p.attainment, exhausted=True)
        if not plan.sim_failed:
            return plan, worst
        if worst is None or sim.attainment > worst.sim.attainment:
            worst = plan
    return None, worst


def solve_problem(p: Problem, budget: Budget, progress: ProgressSink = no_progress,
                  simulate_plans: Optional[bool] = None, model: Optional[ServingModel] = None) -> ServingSolution:
    """Every rate of the sweep, every mode asked; the best plan per rate is chosen by the solution.
    Never returns a plan whose simulated attainment is below the target (such a mode is infeasible).

    ``budget``: each (rate, mode) gets an equal share of the time left; a (rate, mode) not begun by
    the deadline is a time_limit plan (the first rate is always solved). ``progress`` gets one row
    ``{elapsed_s, method, value, bound, gap}`` after each (rate, mode). ``model``: a
    :class:`ServingModel` to reuse (its step-time caches), e.g. one
    :meth:`~ServingModel.retarget`-ed to other SLO targets; its problem replaces ``p``."""
    objectives = objective_registry()
    sm = ServingModel(p) if model is None else model
    p = sm.p
    objective = objectives[p.objective]
    modes = ("aggregated", "disaggregated") if p.mode == "both" else (p.mode,)
    workers = tuple(sm.workers(tuple(r for m in modes for r in MODE_ROLES[m])))
    do_sim = p.simulation.enabled if simulate_plans is None else simulate_plans
    rates = (p.rates[0],) if objective.sense == "max" else p.rates
    results = []
    todo = len(rates) * len(modes)
    for rate in rates:
        plans = {}
        for m in modes:
            if budget.expired() and results:  # not begun: not solved (the first rate always is)
                plans[m] = ModePlan(m, ModeResult(m, Status.TIME_LIMIT, None, None, None, 0.0, rate,
                                                  details=(f"not solved: {NOT_BEGUN}",)))
                budget.note_cut("serving (rate, mode) solves not begun")  # once; the report counts them
            else:
                plan = plan_mode(p, list(workers), m, objective, rate, budget.split(1.0 / todo), do_sim)
                plans[m] = plan
                if plan.sim_cut:
                    budget.note_cut(f"serving simulation of {m} at {rate:g} req/s")
                res = plan.result
                gap = (abs(res.value - res.bound) / max(abs(res.value), 1e-12)
                       if res.value is not None and res.bound is not None else None)
                what = "" if res.value is not None else f" ({res.status.value})"
                progress({"elapsed_s": budget.elapsed_s(), "method": f"highs {m} at {rate:g} req/s{what}",
                          "value": res.value, "bound": res.bound, "gap": gap})
            todo -= 1
        results.append(RateResult(rate, plans))
    solution = ServingSolution(p, sm, workers, objective, tuple(results), budget.elapsed_s())
    progress({"elapsed_s": budget.elapsed_s(), "method": f"done: {solution.status.value}", "value": None,
              "bound": None, "gap": None})
    return solution


def solve_instance(p: Problem, budget: Optional[Budget] = None, simulate_plans: Optional[bool] = None,
                   model: Optional[ServingModel] = None, progress: ProgressSink = no_progress) -> ServingReport:
    """solve -> explain -> report of one problem (library calls, ``--pareto``, ``optimize sweep``);
    ``budget`` None: no time limit."""
    budget = Budget.unlimited() if budget is None else budget
    solution = solve_problem(p, budget, progress, simulate_plans, model)
    return ServingReport(solution, explain(solution, budget))


class ServingPipeline:
    """The serving problem's :class:`~optimizer.problems.Pipeline`; holds no state."""

    def load(self, raw: dict[str, Any], path: Path, objective: Optional[str] = None) -> Problem:
        p = closed_loop_rates(load_problem(raw, path, objective))
        if p.fixed is not None:
            warn_input(path, "serving.fixed", "read by `optimize estimate` only: `optimize` searches for its own plan")
        return p

    def build(self, data: Problem) -> dict[str, ServingMilp]:
        """Stage 1's MILP of each mode asked at the first rate, ``{mode: ServingMilp}`` (rows named
        by their keys: ``model.rows``); a day plan's (``data.windows``): ``{mode: DayMilp}``."""
        objective = objective_registry()[data.objective]
        modes = ("aggregated", "disaggregated") if data.mode == "both" else (data.mode,)
        if data.windows:
            from optimizer.serving import dayplan

            workers, _, _ = dayplan.window_workers(data, tuple(r for m in modes for r in MODE_ROLES[m]))
            return {m: dayplan.build(dayplan.day_data(data, [list(w) for w in workers], m)) for m in modes}
        workers = ServingModel(data).workers(tuple(r for m in modes for r in MODE_ROLES[m]))
        return {m: build(mode_data(data, workers, m, data.rates[0]), objective) for m in modes}

    def solve(self, data: Problem, budget: Budget, progress: ProgressSink = no_progress) -> ServingSolution:
        """The rates' plans; with windows the day plan (:mod:`.dayplan`, a ``DaySolution``)."""
        if data.windows:
            from optimizer.serving.dayplan import solve_day_problem

            return solve_day_problem(data, budget, progress)
        return solve_problem(data, budget, progress)

    def evaluate(self, data: Problem, plan: ServingSolution) -> tuple[Optional[SimResult], ...]:
        """The simulation (:func:`~optimizer.serving.simulate.simulate`) of each rate's best plan,
        None for a rate without one; a day plan: each window's of the chosen mode."""
        if data.windows:
            from optimizer.serving.dayplan import simulate_window

            best = plan.best
            if best is None:
                return ()
            return tuple(simulate_window(data, list(plan.workers[w]), best.result.counts[w], best.mode, win).sim
                         for w, win in enumerate(data.windows))
        out = []
        for rr in plan.results:
            best = plan.best(rr)
            out.append(None if best is None else
                       simulate(data, list(plan.workers), best.result.counts, best.mode, best.rate))
        return tuple(out)

    def explain(self, data: Problem, solution: ServingSolution, budget: Budget) -> ServingExplanation:
        if data.windows:  # a day plan's report states its own conflicts and alternatives
            return None
        return explain(solution, budget)

    def report(self, data: Problem, solution: ServingSolution, explanation: ServingExplanation) -> ServingReport:
        if data.windows:
            from optimizer.serving.dayreport import DayReport

            return DayReport(solution)
        return ServingReport(solution, explanation)

    def robust_twin(self, raw: dict[str, Any], report, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        """``--robust``: the instance planned to ``serving.slo_margin: band`` (TTFT and TPOT targets /
        (1 + the worst pool's measured error), :func:`optimizer.serving.schema._with_band`) and what
        was tightened.

        Raises:
            InputError: the instance is planned to the band already, or a pool's source has no band."""
        import copy

        p = report.problem
        if p.slo_margin is not None:
            raise InputError(path, "--robust", "serving.slo_margin is band already: that plan is the robust one")
        missing = [name for name, t in p.timing.items() if t["error_band"] is None]
        if missing:
            raise InputError(path, "--robust", f"no measured error band for {', '.join(missing)} under "
                                               f"{p.timing[missing[0]]['why']} (instances/hardware/fidelity.yaml): "
                                               f"uncalibrated")
        et = max(t["error_band"]["ttft_median_abs_error"] for t in p.timing.values())
        ep = max(t["error_band"]["tpot_median_abs_error"] for t in p.timing.values())
        twin = copy.deepcopy(raw)
        twin["serving"]["slo_margin"] = "band"
        return twin, {"tightened": f"TTFT {p.ttft_s * 1e3:g} ms / (1 + {et:.0%}), TPOT {p.tpot_s * 1e3:g} ms / "
                                   f"(1 + {ep:.0%})", "band": {"ttft_error": et, "tpot_error": ep}}


PIPELINE = ServingPipeline()
