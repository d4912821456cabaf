"""The explanation of a serving solution: binding limits, why the other mode lost, conflicts and,
when no plan exists, the best achievable (the highest rate the GPUs serve, else the lowest TTFT or
TPOT any worker reaches, else the widest worker's memory shortfall).
"""
from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Any, Optional

from optimizer.budget import Budget
from optimizer.result import Binding, ConstraintKey, Conflict, Status, group_conflicts
from optimizer.serving.perf import LIMITS
from optimizer.serving.schema import Problem
from optimizer.serving.solution import ModePlan, RateResult, ServingSolution


@dataclass(frozen=True)
class ServingExplanation:
    """What the report explains.

    Attributes:
        binding: the limits of the headline plan (:meth:`ServingSolution.headline`), least slack first.
        alternatives: per rate (in ``solution.results`` order), why each other mode lost:
            ``{option, reason, detail, mode, rate_rps}``.
        conflicts: the conflicting keys of every rate without a plan, grouped by family
            (:func:`~optimizer.result.group_conflicts`, each group with all its details).
        achievable: infeasible only: the best the instance reaches (``requirement``, ``best``,
            ``required``, ``detail``), None otherwise or when nothing fits at all.
        time_s: wall time of the explanation's own solves (the best achievable rate), s.
    """

    binding: tuple[Binding, ...]
    alternatives: tuple[tuple[dict[str, Any], ...], ...]
    conflicts: tuple[dict[str, Any], ...]
    achievable: Optional[dict]
    time_s: float


def plan_conflict(solution: ServingSolution, m: ModePlan) -> Optional[Conflict]:
    """Why ``m`` is no plan (the MILP's conflict, or a simulation below target); None for a plan."""
    if m.result.counts is None:
        return Conflict(list(m.result.conflict), list(m.result.details))
    if m.sim_failed:
        return Conflict([ConstraintKey("simulation", f"{m.mode} at {m.rate:g} req/s")],
                        [_miss_detail(solution, m)])
    return None


def _miss_detail(solution: ServingSolution, m: ModePlan) -> str:
    """Why a simulated plan is not a plan: its attainment, the capacity it was given and its GPUs."""
    gpus = sum(solution.workers[j].gpus * n for j, n in m.result.counts.items())
    cap = ", ".join(f"{r} {v:.3g}x" for r, v in sorted(m.role_margins.items())) or f"{m.margin:g}x"
    where = ("on the most capacity the GPUs given hold" if m.exhausted else f"with {cap} the rate's capacity")
    return (f"the best simulated attainment reached, {m.sim.attainment:.1%} (TTFT alone {m.sim.ttft_attainment:.1%}, "
            f"TPOT alone {m.sim.tpot_attainment:.1%}), stays below {solution.problem.attainment:.0%} {where} "
            f"({gpus} GPUs)")


def conflict_groups(solution: ServingSolution) -> list[dict[str, Any]]:
    """Conflicting keys of every rate without a plan, grouped by family (envelope ``conflicts``),
    each group with its first detail and all of them."""
    keys, details = [], {}
    for rr in solution.results:
        if solution.best(rr) is not None:
            continue
        for m in rr.plans.values():
            c = plan_conflict(solution, m)
            if c is None:
                continue
            if not c.keys and c.details:  # no worker configuration at all for a role
                c = Conflict([ConstraintKey("layouts", m.mode)], ["; ".join(c.details)])
            for i, k in enumerate(c.keys):
                line = c.details[i] if i < len(c.details) else "; ".join(c.details)
                if k not in details:
                    keys.append(k)
                    details[k] = f"{m.mode} at {rr.rate:g} req/s: {line}"
    groups = group_conflicts(keys, details)
    for g in groups:
        g["details"] = [details[k] for k in keys if k.family == g["family"]]
    return groups


def why_lost(solution: ServingSolution, rr: RateResult) -> tuple[dict[str, Any], ...]:
    """The other modes at this rate: ``{option, reason, detail, mode, rate_rps}``."""
    best = solution.best(rr)
    obj = solution.objective
    out = []
    for m in rr.plans.values():
        if best is not None and m is best:
            continue
        c = plan_conflict(solution, m)
        option = f"{m.mode} at {rr.rate:g} req/s"
        if c is not None:
            fams = sorted({k.family for k in c.keys})
            reason = f"infeasible ({', '.join(fams)})"
            why = f"{m.mode}: no plan ({', '.join(fams)}): " + "; ".join(c.details[:3])
        elif best is not None and math.isclose(m.result.value, best.result.value, rel_tol=1e-9, abs_tol=1e-12) \
                and solution.gpus(m) == solution.gpus(best):
            # solution.best's order: objective, then GPUs, then the mode's name
            reason = "tie"
            why = (f"{m.mode}: {obj.name} {m.result.value:.4g} {obj.unit} and {solution.gpus(m)} GPUs, the same as "
                   f"{best.mode}; the tie goes to {best.mode} (the modes in name order: aggregated runs one kind "
                   f"of worker)")
        elif best is not None:
            gp = "" if obj.name == "gpus" else f" ({solution.gpus(m)} GPUs vs {solution.gpus(best)})"
            reason = f"worse {obj.name}"
            why = (f"{m.mode}: {obj.name} {m.result.value:.4g} {obj.unit} vs "
                   f"{best.result.value:.4g} for {best.mode}{gp}")
        else:
            reason, why = "no plan", f"{m.mode}: no plan"
        out.append({"option": option, "reason": reason, "detail": why, "mode": m.mode, "rate_rps": rr.rate})
    return tuple(out)


def bindings(solution: ServingSolution, m: Optional[ModePlan]) -> tuple[Binding, ...]:
    """What limits plan ``m``: each chosen configuration's own limit (slack 0), each role's
    capacity (slack in req/s) and each pool's GPUs (slack in GPUs), least slack first."""
    if m is None or m.result.counts is None:
        return ()
    p, workers = solution.problem, solution.workers
    out = []
    cap: dict[str, float] = {}
    for j, n in sorted(m.result.counts.items()):
        w = workers[j]
        cap[w.role] = cap.get(w.role, 0.0) + w.capacity(n)
        detail = solution.model.prefill_detail(w, n) if w.role == "prefill" and w.pooling and n > 1 else w.detail
        out.append(Binding(ConstraintKey(w.limit, w.label(p)), 0.0, "", f"{LIMITS.get(w.limit, w.limit)}: {detail}"))
    for role, c in cap.items():
        out.append(Binding(ConstraintKey("capacity", role), c - m.rate, "requests/s",
                           f"{role} workers carry up to {c:.4g} req/s for {m.rate:g} req/s"))
        k = m.role_margins.get(role, 1.0)
        if k > 1.0:
            out.append(Binding(ConstraintKey("simulated", role), c - k * m.rate, "requests/s",
                               f"the simulation asked {role} for {k:.3g}x {m.rate:g} req/s of rated capacity "
                               f"(the arrivals' bursts: fewer missed the attainment)"))
    for i, pool in enumerate(p.pools):
        used = sum(workers[j].gpus * n for j, n in m.result.counts.items() if workers[j].pool == i)
        out.append(Binding(ConstraintKey("gpus", f"pool {pool.name}"), pool.count - used, "GPUs",
                           f"{used} of {pool.count} {pool.gpu} GPUs used"))
    out += [b for j in sorted(m.result.counts) if workers[j].layout.cp > 1
            for b in [why_context_parallel(p, workers, workers[j])] if b is not None]
    return tuple(sorted(out, key=lambda b: b.slack))


def why_context_parallel(p: Problem, workers, w) -> Optional[Binding]:
    """Why a context-parallel prefill worker ``w`` is in the plan: the fastest prefill worker
    without CP on the same pool and at most as many GPUs, its zero-load TTFT against the target
    (slack = target - that TTFT, ms: negative when only CP meets the TTFT, i.e. TTFT binds), and
    ``w``'s own prefill terms (:func:`optimizer.model.prefill.prefill_terms`). None when no such
    worker was timed."""
    from optimizer.model.prefill import prefill_terms

    rivals = [v for v in workers if v.role == w.role and v.pool == w.pool and v.layout.cp == 1
              and v.gpus <= w.gpus and "ttft_s" in (v.zero_load or {})]
    pool = p.pools[w.pool]
    isl = int(p.traffic.isl_quantile(p.quantile))
    t = prefill_terms(pool.perf, w.layout, isl, p.eff)
    own = (f"{w.layout.label()} prefills the {isl}-token prompt in {w.zero_load.get('prefill_s', t.total_s) * 1e3:.0f} ms "
           f"({t.tokens_per_rank:.0f} tokens and {t.pairs_per_rank:.3g} causal pairs per CP rank, zig-zag; K/V "
           f"{pool.perf.cp_kv_exchange} {t.kv_exchange_s * 1e3:.0f} ms, {t.kv_exposed_s * 1e3:.0f} ms not hidden)")
    if not rivals:
        nothing = [v for v in workers if v.role == w.role and v.pool == w.pool and v.layout.cp == 1 and v.gpus <= w.gpus]
        why = f"; {nothing[0].layout.label()}: {nothing[0].detail}" if nothing else ""
        return Binding(ConstraintKey("context_parallel", w.label(p)), 0.0, "ms",
                       f"CP chosen: no prefill worker without CP on up to {w.gpus} GPUs holds the prompt{why}; {own}")
    best = min(rivals, key=lambda v: v.zero_load["ttft_s"])
    tb = best.zero_load["ttft_s"]
    slack = (p.ttft_s - tb) * 1e3
    if tb > p.ttft_s:
        head = (f"CP chosen, TTFT binding: the fastest prefill without CP on up to {w.gpus} GPUs, {best.layout.label()}, "
                f"reaches TTFT {tb * 1e3:.0f} ms even without load > target {p.ttft_s * 1e3:g} ms")
    else:
        head = (f"CP chosen by the objective (TTFT {p.ttft_s * 1e3:g} ms is met without CP too: {best.layout.label()} "
                f"{tb * 1e3:.0f} ms at zero load, {best.rate:.3g} req/s per worker vs {w.rate:.3g})")
    return Binding(ConstraintKey("context_parallel", w.label(p)), slack, "ms", f"{head}; {own}")


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


def most_rate(solution: ServingSolution, goodput, budget: Budget) -> dict | None:
    """For an infeasible rate: the highest rate any mode serves within the SLOs on the GPUs given
    (the ``goodput`` objective, analytic model), or None when not even a small rate fits."""
    from optimizer.serving import plan_mode

    p = solution.problem
    best = None
    for m in solution.results[0].plans:
        plan = plan_mode(p, list(solution.workers), m, goodput, p.rates[0], budget, False)
        if plan.result.counts is not None and plan.result.value and (best is None or plan.result.value > best[1]):
            best = (m, float(plan.result.value))
    if best is None:
        return None
    asked = max(p.rates)
    return {"requirement": "rate_rps", "best": best[1], "required": asked,
            "detail": f"at most {best[1]:.3g} req/s within the SLOs on the GPUs given ({best[0]}, analytic model); "
                      f"{asked:g} req/s asked"}


def explain(solution: ServingSolution, budget: Budget) -> ServingExplanation:
    """The explanation of ``solution``; the best achievable rate's goodput solves run within ``budget``."""
    import time

    from objectives.serving import registry

    t0 = time.perf_counter()
    achievable = None
    if solution.status in (Status.INFEASIBLE, Status.NOT_FOUND):
        objectives = registry()
        if solution.objective.sense == "min" and "goodput" in objectives:
            achievable = most_rate(solution, objectives["goodput"], budget)
        if achievable is None:
            achievable = best_achievable_slo(solution.problem, solution.workers)
    headline = solution.best(solution.headline())
    return ServingExplanation(bindings(solution, headline), tuple(why_lost(solution, rr) for rr in solution.results),
                              tuple(conflict_groups(solution)), achievable, time.perf_counter() - t0)
