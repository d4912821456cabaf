"""Serving capacity planning: requests at R per second with ISL/OSL tokens, TTFT/TPOT targets at a
percentile and an attainment; the cheapest set of workers, aggregated (continuous batching with
chunked prefill) or disaggregated (prefill and decode pools with the KV moved between them).

Pipeline: :mod:`.schema` (strict input, traffic, units) -> :mod:`.perf` (every worker
configuration's largest rate within the SLOs, on the shared model :mod:`optimizer.model`) ->
:mod:`.solve` (one MILP per mode, PuLP + HiGHS, families in ``constraints/serving/``,
objectives in ``objectives/serving/``) -> :mod:`.simulate` (independent SimPy evaluator; a plan
below the attainment target is re-solved with more capacity, never returned) -> :mod:`.report`
(result envelope, tables, launch commands from :mod:`.launch`).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from objectives.serving import registry as objective_registry
from optimizer.budget import Budget, ProgressSink
from optimizer.result import Status
from optimizer.serving.perf import ServingModel
from optimizer.serving.report import NOT_BEGUN, ModePlan, RateResult, ServingReport
from optimizer.serving.schema import Problem, load
from optimizer.serving.simulate import SimulationCut, simulate
from optimizer.serving.solve import MODE_ROLES, ModeResult, solve_mode

__all__ = ["run", "load_problem", "solve_instance", "ServingReport"]

MARGINS = (1.0, 1.1, 1.25, 1.5, 2.0)


def load_problem(raw: dict[str, Any], path: str | Path, objective: str | None = None) -> Problem:
    return load(raw, path, objective, objective_registry())


def _with_margin(res, first, margin: float):
    """A plan accepted only with extra capacity is no longer proven optimal for the rate asked:
    status feasible, bound = the analytic optimum at margin 1 (a bound under the analytic model)."""
    if margin > 1.0:
        res.status = Status.FEASIBLE
        res.bound = first.bound if first is not None and first.bound is not None else res.bound
    return res


def _plan_mode(p: Problem, sm: ServingModel, workers, mode: str, objective, rate: float, limit_s: float,
               do_sim: bool, deadline: float | None = None) -> ModePlan:
    """Solve one mode, then check it in simulation; on a miss re-solve with ``MARGINS`` more capacity
    (goodput: report a lower rate for the same plan) until the simulated attainment meets the target.

    ``deadline`` (a ``time.perf_counter()`` value, from ``--time-limit``): a simulation still
    running then is abandoned and the plan returned on the analytic model's checks alone, with
    ``sim_cut`` set (the report says so); later solves get the time left as their limit."""
    try:
        return _plan_mode_checked(p, sm, workers, mode, objective, rate, limit_s, do_sim, deadline)
    except SimulationCut as cut:
        plan, why = cut.args
        plan.sim_cut = why
        return plan


def _plan_mode_checked(p, sm, workers, mode, objective, rate, limit_s, do_sim, deadline) -> ModePlan:
    goodput = objective.sense == "max"
    first = None

    def sim_(res, counts, served, margin):
        try:
            return simulate(p, workers, counts, mode, served, deadline=deadline)
        except SimulationCut as cut:
            if goodput and margin > 1.0:
                res.value = served
            raise SimulationCut(ModePlan(mode, _with_margin(res, first, margin), rate=served, margin=margin),
                                str(cut)) from None

    for margin in MARGINS:
        limit = limit_s if deadline is None else max(0.05, min(limit_s, deadline - time.perf_counter()))
        res = solve_mode(p, workers, mode, objective, rate * margin, limit)
        if first is None:
            first = res
        if res.counts is None:
            if margin == 1.0:
                return ModePlan(mode, res)
            break
        served = res.rate / margin if goodput else rate
        if goodput:
            res.value = served
        if not do_sim:
            return ModePlan(mode, res, rate=served, margin=margin)
        sim = sim_(res, res.counts, served, margin)
        if sim.attainment >= p.attainment:
            return ModePlan(mode, _with_margin(res, first, margin), sim, served, margin)
        last = (res, sim, served, margin)
        if goodput:  # same plan, lower rate
            for m2 in MARGINS[1:]:
                served = res.rate / m2
                sim = sim_(res, res.counts, served, m2)
                if sim.attainment >= p.attainment:
                    res.value = served
                    return ModePlan(mode, _with_margin(res, first, m2), sim, served, m2)
            break
    res, sim, served, margin = last
    failed = ModePlan(mode, res, sim, served, margin)
    failed.sim_failed = True
    return failed


def solve_instance(p: Problem, time_limit_s: float | None = None, simulate_plans: bool | None = None,
                   model: ServingModel | None = None, deadline: float | None = None) -> ServingReport:
    """Every rate of the sweep, every mode asked; best plan per rate. Never returns a plan whose
    simulated attainment is below the target (such a mode is reported infeasible).

    ``model``: a :class:`ServingModel` to reuse (its step-time caches), e.g. one
    :meth:`~ServingModel.retarget`-ed to other SLO targets; its problem replaces ``p``."""
    t0 = time.perf_counter()
    if deadline is None and time_limit_s is not None:
        deadline = Budget.for_command(time_limit_s, started=t0).deadline
    objectives = objective_registry()
    sm = ServingModel(p) if model is None else model
    p = sm.p
    objective = objectives[p.objective]
    modes = ("aggregated", "disaggregated") if p.mode == "both" else (p.mode,)
    roles = tuple(r for m in modes for r in MODE_ROLES[m])
    workers = sm.workers(roles)
    do_sim = p.simulation.enabled if simulate_plans is None else simulate_plans
    limit = 20.0 if time_limit_s is None else time_limit_s
    rates = (p.rates[0],) if objective.sense == "max" else p.rates
    results = []
    todo = len(rates) * len(modes)
    for rate in rates:
        plans = {}
        for m in modes:  # each (rate, mode) gets an equal share of the time left
            if deadline is not None and time.perf_counter() >= deadline and results:  # not begun: not solved
                # (the first rate is always solved: a plan, on the analytic checks if need be)
                plans[m] = ModePlan(m, ModeResult(m, Status.TIME_LIMIT, None, None, None, 0.0, rate,
                                                  details=[f"not solved: {NOT_BEGUN}"]))
            else:
                share = None if deadline is None else time.perf_counter() + (deadline - time.perf_counter()) / todo
                plans[m] = _plan_mode(p, sm, workers, m, objective, rate, limit, do_sim, share)
            todo -= 1
        results.append(RateResult(rate, plans))
    rep = ServingReport(p, sm, workers, objective, results, time.perf_counter() - t0)
    if rep.status == Status.INFEASIBLE and objective.sense == "min" and "goodput" in objectives:
        rep.achievable = _most_rate(p, sm, workers, objectives["goodput"], modes, limit)
        rep.time_s = time.perf_counter() - t0
    if rep.status == Status.INFEASIBLE and rep.achievable is None:
        rep.achievable = best_achievable_slo(p, workers)
    return rep


def best_achievable_slo(p: Problem, workers) -> dict | None:
    """For an SLO no worker meets even without load: the lowest TTFT (else TPOT) any worker
    configuration reaches at zero load (the analytic model), against the target; when no worker
    holds the model at all, the widest one's memory shortfall."""
    for key, target in (("ttft_s", p.ttft_s), ("tpot_s", p.tpot_s)):
        vals = [w.zero_load[key] for w in workers if key in (w.zero_load or {})]
        if vals and min(vals) > target:
            best = min(vals) * 1e3
            name = key[:4].upper()
            return {"requirement": f"{key[:4]}_ms", "best": best, "required": target * 1e3,
                    "detail": f"the lowest {name} any worker reaches even without load is {best:.4g} ms; "
                              f"{target * 1e3:g} ms required"}
    mem = [w for w in workers if w.limit in ("weights", "kv_memory")]
    if mem and len(mem) == len(workers):  # no layout holds the model and a request: the widest says by how much
        w = max(mem, key=lambda w: w.gpus)
        return {"requirement": "memory", "best": None, "required": None,
                "detail": f"no worker holds the weights and a request's KV; the widest, {w.label(p)}: {w.detail}"}
    return None


def _most_rate(p: Problem, sm, workers, goodput, modes, limit: float) -> dict | None:
    """For an infeasible rate: the highest rate any mode serves within the SLOs on the GPUs given
    (the goodput objective, analytic model), or None when not even a small rate fits."""
    best = None
    for m in modes:
        plan = _plan_mode(p, sm, workers, m, goodput, p.rates[0], limit, False)
        if plan.result.counts is not None and plan.result.value and (best is None or plan.result.value > best[1]):
            best = (m, float(plan.result.value))
    if best is None:
        return None
    asked = max(p.rates)
    return {"requirement": "rate_rps", "best": best[1], "required": asked,
            "detail": f"at most {best[1]:.3g} req/s within the SLOs on the GPUs given ({best[0]}, analytic model); "
                      f"{asked:g} req/s asked"}


def run(raw: dict[str, Any], path: Path, objective: str | None, budget: Budget,
        output_dir: Path | None, progress: ProgressSink | None = None) -> ServingReport:
    """CLI entry point (see optimizer/problems.py); ``--output DIR`` also gets the launch scripts.

    Raises:
        InputError: bad input (one line naming file, field and problem).
    """
    p = load_problem(raw, path, objective)
    rep = solve_instance(p, budget.limit_s, deadline=budget.deadline)
    if output_dir is not None:
        rep.write_scripts(Path(output_dir))
    return rep
