"""The anytime solve: a plan first, a bound early, exact where it is cheap, then improvement.

Shares and limits are fields of :class:`~optimizer.deployment.settings.AnytimeSettings`.
Budget of ``deadline − now`` (all parts stop by their share; the final evaluation is reserved):

1. constructive plan (:meth:`~optimizer.deployment.anytime.Anytime.construct`), re-checked by
   the independent evaluator: at most 10 % of the budget (the first mix always finishes); when
   none meets the on-time requirement, one at a time, the earliest-deadline best fit over a
   climb of instance mixes (:func:`most_on_time_mix`, ``most_on_time_share`` of the budget),
   else the configuration LP's most-on-time plan (few classes),
   else (the LP relaxation not ruling it out) the aggregate CP-SAT feasibility model, which
   proves infeasibility or gives a plan (``aggregate_share`` of the time left), else LNS repairs
   the plan with the fewest sessions missing, one more on time per step, until
   ``repair_share`` of the budget;
2. LP bound (:class:`~optimizer.deployment.anytime.BoundLP`): up to 15 %; then local search
   from the best ``multi_starts`` constructive plans (the LP's instance mix among the mixes),
   ``start_share`` of what is left;
2b. configuration LP (:class:`~optimizer.deployment.colgen.ConfigLP`; at most
   ``CG_MAX_CLASSES`` classes, beyond what the exact search proves (more than ``exact_classes``
   classes or ``exact_sessions`` sessions), cost and makespan objectives; batched kinds only with
   ``cg_batched_min_s`` left, their pricing being slower), after the packings at the LP's
   makespan: the LP bound tightened by column generation at the makespan thresholds that decide
   it, ``cg_share`` of what is left (``cg_share_batched`` batched); plans
   from its integer master at the bound's makespan and a few above it;
2c. instance-mix search (:func:`mix_search`): hill climbing over the instances per kind from
   the LP's mix rounded and the incumbent's, each mix scored by packings and list schedules at
   makespan targets a little above the LP's, ``mix_share`` of what is left; its best plans
   start the local search of step 2;
3. exact search: with at most ``exact_classes`` classes (exact equality) the exact
   formulations of :mod:`optimizer.deployment.exact` on the real instance with up to 60 % of
   what is left (25 % above ``exact_sessions`` sessions; a proven optimum is returned as is:
   small instances are solved as before);
   otherwise rounded instances (:func:`~optimizer.deployment.anytime.rounded_problem`) of
   growing size with up to ``rounded_share`` of what is left (at most 5 % of the budget);
4. local improvement on the real instance (:meth:`~optimizer.deployment.anytime.Anytime.improve`,
   ``local_share`` of what is left), then large-neighbourhood search
   (:func:`~optimizer.deployment.lns.lns`: a few instances freed and re-decided by CP-SAT, kinds
   included) until the deadline or until the plan meets the bound.

The result states which of these produced the plan (``formulation`` and ``notes``).
"""
from __future__ import annotations

import math
import time
from typing import Optional

import numpy as np

from optimizer.deployment import anytime as at
from optimizer.deployment.evaluate import evaluate
from optimizer.deployment.exact import aggregate_feasibility, solve_exact
from optimizer.deployment.outcome import SolveOutcome, finish
from optimizer.deployment.params import kv_gpus_needed, usable_degrees
from optimizer.deployment.progress import Progress
from optimizer.deployment.settings import AnytimeSettings
from optimizer.deployment.lns import lns
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import Problem
from optimizer.model.layout import Layout
from optimizer.result import SolverStats, Status

DEFAULT = AnytimeSettings()  # frozen: the defaults of every anytime share


def solve_anytime(problem: Problem, perf: PerfModel, obj, deadline: float, degrees=None, layouts=None,
                 progress: Optional[Progress] = None, settings: Optional[AnytimeSettings] = None):
    """Solve ``problem`` (no faults) within ``deadline`` (a ``time.perf_counter()`` value).

    Returns:
        SolveOutcome: optimal (exact search, or bound met), or feasible with the LP bound and the
        gap; None when no constructive plan exists (every session must then be placed by the
        exact formulations, which also explain infeasibility).
    Raises:
        InputError: an objective the batched search cannot express (as the exact path).
    """
    progress = progress or Progress.off()
    cfg = settings or DEFAULT
    t0 = time.perf_counter()
    total = max(0.05, deadline - t0)
    if not problem.tp_only:
        from optimizer.deployment.batching import check_supported

        check_supported(problem, obj)
    allowed, lays = anytime_layouts(problem, perf, degrees, layouts)
    A = at.Anytime(problem, perf, obj, lays)
    mode = "anytime"
    if not A.kinds:
        return None
    if not all(any(k.fits[c.index] for k in A.kinds) for c in problem.classes) and \
            len(problem.sessions) > cfg.small_sessions:
        # a session fits no instance even alone: proven infeasible without a search
        st = SolverStats("anytime (memory check)", Status.INFEASIBLE, time.perf_counter() - t0, solves=0)
        return SolveOutcome(Status.INFEASIBLE, obj, None, None, None, st, allowed, mode)
    if not problem.tp_only and len(problem.sessions) > cfg.small_sessions:
        # the sessions' KV alone may need more GPUs than there are: no search (O(classes) to check;
        # TP-only problems keep the LP's proof, whose explanation says how many fit)
        out = _kv_memory_verdict(problem, perf, obj, allowed, SolverStats("anytime (KV memory bound)",
                                                                          Status.INFEASIBLE, 0.0, solves=0), t0)
        if out is not None:
            return out
    unit = obj.unit
    notes: list[str] = []
    sol = A.construct(t0 + 0.1 * total, hard=deadline)
    te = time.perf_counter()
    ev = evaluate(problem, A.plan(sol), perf) if sol is not None else None
    eval_s = time.perf_counter() - te

    def short_of(ev) -> bool:
        """No plan, one the evaluator rejects, or one the objective cannot value (fewer on
        time than the objective needs, e.g. none for cost: a fresh user's 0.1 µs deadline was
        reported feasible at cost inf)."""
        return ev is None or bool(ev.violations) or not math.isfinite(obj.value(ev))

    source = "list scheduling"
    if short_of(ev):  # earliest-deadline best fit over mixes (one at a time)
        short = sol
        sol = most_on_time_mix(A, t0 + cfg.most_on_time_share * total, cfg)
        ev = evaluate(problem, A.plan(sol), perf) if sol is not None else None
        source = "earliest-deadline best fit (most on time)"
        if sol is not None and (short is None or A.scenario(sol).on_time > A.scenario(short).on_time):
            short = sol  # the closest plan for the repair below
    if short_of(ev):  # the configuration LP's most-on-time plan, where it applies
        sol = most_on_time_plan(problem, A, t0 + 0.5 * total)
        ev = evaluate(problem, A.plan(sol), perf) if sol is not None else None
        source = "configuration LP (integer master, most on time)"
        if short_of(ev):
            verdict = _no_plan(problem, perf, obj, A, allowed, t0, deadline, cfg)
            if verdict is None or verdict.status == Status.INFEASIBLE:
                return verdict  # small (the exact path decides), or proven infeasible by the LP
            decided, sol = _decide_by_aggregate(problem, perf, obj, A, allowed, verdict,
                                                time.perf_counter() + cfg.aggregate_share * (deadline - time.perf_counter()))
            if decided is not None:
                return decided  # the aggregate model proves that no plan exists
            ev = evaluate(problem, A.plan(sol), perf) if sol is not None else None
            source = "aggregate CP-SAT (feasibility)"
            if short_of(ev) and short is not None:
                sol = repair_on_time(A, short, t0 + cfg.repair_share * total)
                ev = evaluate(problem, A.plan(sol), perf) if sol is not None else None
                source = "list scheduling repaired towards the on-time requirement by LNS"
            if short_of(ev):
                verdict.stats.time_s = time.perf_counter() - t0
                return verdict
    best, best_v = sol, obj.value(ev)
    rule = [A.tradeoff]  # the batch limit rule the best plan was run under
    progress.report("constructive plan" if source == "list scheduling" else source, best_v, None)
    reserve = 1.5 * eval_s + 0.05

    def left() -> float:
        return deadline - reserve - time.perf_counter()

    def offer(cand, why: str) -> None:
        nonlocal best, best_v, source
        if cand is None:
            return
        v = A.score(cand)
        if v < best_v * (1 - 1e-12):
            best, best_v, source = cand, v, why
            rule[0] = A.rule_of.get(id(cand), A.tradeoff)
            progress.report(why, best_v, bound)

    # 2. bound
    bound = None
    lp = at.BoundLP(problem, perf, A.kinds)
    r = A.scenario(best)
    try:
        bound, mix = at.bound_in_unit(problem, obj, lp, r, time.perf_counter() + max(0.05, 0.15 * total))
    except Exception as exc:  # the bound is optional: a failed LP leaves it unknown, never wrong
        bound, mix = None, None
        notes.append(f"LP bound not computed: {exc}")
    bound_source = "fluid LP relaxation (HiGHS)"
    progress.report("LP bound", best_v, bound)

    def proven() -> bool:  # strict: small instances still go on to the exact search's proof
        return bound is not None and bound >= best_v * (1 - 1e-9)

    stats = SolverStats("anytime (list scheduling, HiGHS LP bound)", Status.FEASIBLE, 0.0, solves=lp.solves)

    def improved_by(phase: str):
        """Callback for a search phase: keep a better plan, name the phase in ``source``."""
        def keep(insts, v):
            nonlocal best, best_v, source
            if v < best_v * (1 - 1e-12):
                best, best_v = insts, v
                rule[0] = A.tradeoff
                if phase not in source:
                    source += f" + {phase}"
                progress.report(phase, best_v, bound)
        return keep

    better = improved_by("local search")

    if not proven() and lp.best_T is not None and left() > 0:  # packings at the LP's makespan
        packs = _packings(A, lp, mix, time.perf_counter() + min(0.1 * total, 0.2 * left()), cfg)
        for cand in packs:
            offer(cand, "packing at the LP makespan")
    # 2a. bounded columns (batched threshold objectives, few session classes): optimistic
    # columns simulated when chosen; a proof over every batch limit and admission order
    side = None  # its plan when better than the anytime plan but not proven (kept with its order)
    tried_bounded = False
    if not proven() and not problem.tp_only and left() > 0.2:
        from optimizer.deployment.exact import bounded_applies, solve_bounded

        if bounded_applies(problem, perf, obj):
            tried_bounded = True
            inc = evaluate(problem, A.plan(best), perf)
            got = solve_bounded(problem, perf, obj, time.perf_counter() + cfg.bounded_share * left(), lays, inc)
            if got is not None:
                stats.solves += got.stats.solves
                tag = f"anytime search ({got.stats.name})"
                if got.status == Status.OPTIMAL:
                    got.bound_method = tag
                    got.method = tag if got.evaluation is not inc else f"anytime search ({source})"
                    if got.evaluation is inc:
                        got.mode = f"anytime ({source})"
                    got.notes.insert(0, f"{len(problem.sessions)} sessions in {len(problem.classes)} "
                                        f"class{'es' if len(problem.classes) != 1 else ''}; "
                                        f"plan from {'the bounded columns' if got.evaluation is not inc else source}, "
                                        f"proven optimal over every batch limit and admission order")
                    return got
                if got.bound is not None and (bound is None or got.bound > bound):
                    bound = min(got.bound, best_v)
                    bound_source = tag
                    progress.report("bounded columns", best_v, bound)
                if got.evaluation is not None and got.evaluation is not inc and got.value is not None \
                        and got.value < best_v * (1 - 1e-12):
                    side = got
                    progress.report("bounded columns (plan)", got.value, bound)

    # 2b. configuration LP (few classes): a tighter bound by column generation, and plans from
    # its integer master
    batched_cg = any(k.batch_cap > 1 for k in A.kinds)  # slower: ~10 s a threshold on 12 classes
    exact_first = len(problem.classes) <= cfg.exact_classes and len(problem.sessions) <= cfg.exact_sessions
    if not proven() and lp.cg is not None and not exact_first and obj.search in ("cost", "makespan") and \
            left() > (cfg.cg_batched_min_s if batched_cg else 0.2):
        cg_end = time.perf_counter() + (cfg.cg_share_batched if batched_cg else cfg.cg_share) * left()
        lp.cg.add_plan(A.columns(best))  # the incumbent's instances are configurations too
        tighter = at.refined_bound_in_unit(problem, obj, lp, cg_end)
        if tighter is not None and (bound is None or tighter > bound):
            bound = min(tighter, best_v)
            bound_source = "configuration LP (column generation, HiGHS)"
            progress.report("configuration LP bound", best_v, bound)
        if lp.best_T is not None:
            for f in cfg.cg_plan_slack:
                if left() <= 0 or proven():
                    break
                got = lp.cg.integer_plan(lp.best_T * f, time.perf_counter() + min(2.0, 0.05 * left()))
                offer(A.from_classes(got) if got else None, "configuration LP (integer master)")

    if not proven() and obj.lp_bound == "gpus" and left() > 0:  # fewest GPUs: plans on the LP's mixes
        for cand in fewest_gpus(A, lp, int(bound or 1), int(best_v), time.perf_counter() + cfg.gpus_share * left()):
            offer(cand, "fewest-GPU mixes")
    mixed = []  # plans of the mix search (step 2c), starting points of the local search
    if not proven() and lp.best_T is not None and left() > 0:
        mixed = mix_search(A, lp.best_T, [A.mixes(mix)[0]] if mix is not None else [],
                            best, time.perf_counter() + cfg.mix_share * left(), cfg)
        for cand in mixed[:1]:
            offer(cand, "instance-mix search")
    if not proven() and left() > 0:  # local search from the best few constructive plans
        first, first_rule = best, rule[0]
        starts = [first] + [m for m in mixed[:cfg.mix_starts] if m is not first]
        starts += A.construct_many(time.perf_counter() + max(0.05, 0.05 * total), mix)[:max(0, cfg.multi_starts - len(starts))]
        A.rule_of[id(first)] = first_rule
        for n, start in enumerate(starts):
            if left() <= 0 or proven():
                break
            A.tradeoff = A.rule_of.get(id(start), A.tradeoff)
            A.improve(start, time.perf_counter() + cfg.start_share * left() / (len(starts) - n), better)

    # 3. exact search
    exact = "none"
    if not proven() and len(problem.classes) <= cfg.exact_classes and left() > 0.2:
        share = cfg.exact_share if len(problem.sessions) <= cfg.exact_sessions else cfg.exact_share_large
        out = solve_exact(problem, obj, time.perf_counter() + share * left(), degrees, perf, layouts, progress,
                          bounded=not tried_bounded)
        stats.solves += out.stats.solves
        if out.status == Status.OPTIMAL:
            out.method = out.bound_method = f"anytime search (exact formulations: {out.stats.name})"
            return out  # small instances: the exact search's proven optimum
        exact = f"exact search on the {len(problem.classes)} classes ({out.status.value})"
        if out.evaluation is not None and not out.evaluation.violations:
            offer(A.from_plan(out.evaluation.plan), "exact search (incomplete)")
            if out.bound is not None and (bound is None or out.bound > bound):
                bound = out.bound
                bound_source = f"exact formulations ({out.stats.name})"
    elif not proven():
        tried = []
        for lv in cfg.rounded_levels:
            if left() < 0.5 or proven():
                break
            rp = at.rounded_problem(problem, lv)
            if len(rp.classes) >= len(problem.classes):
                break
            share = time.perf_counter() + min(0.05 * total, cfg.rounded_share * left()) / max(1, len(cfg.rounded_levels) - len(tried))
            out = solve_exact(rp, obj, share, degrees, PerfModel(rp), layouts)
            stats.solves += out.stats.solves
            tried.append(f"{len(rp.classes)} classes: {out.status.value}")
            if out.evaluation is not None and not out.evaluation.violations:
                offer(A.from_plan(out.evaluation.plan), f"rounded instance ({len(rp.classes)} classes)")
        if tried:
            exact = "rounded instances (lengths up, deadlines down) by the exact search: " + ", ".join(tried)
    # 4. improvement: local moves, then large-neighbourhood search until the deadline. The
    # exact part has had its chance to prove the optimum, so these stop as soon as the status
    # tolerance holds (a deadline equal to a finish time left a 1e-7 gap, and LNS ran its whole
    # 60 s on 4 sessions)
    A.tradeoff = rule[0]

    def met() -> bool:
        return bound is not None and bound >= best_v * (1 - cfg.optimal_gap)

    if not met() and left() > 0:
        A.improve(best, time.perf_counter() + max(0.0, cfg.local_share * left()), better)
    if not met() and left() > 0.1:
        lns(A, best, time.perf_counter() + left(), improved_by("LNS"),
            bound=None if bound is None else bound / (1 - cfg.optimal_gap))
    plan = A.plan(best)
    ev = evaluate(problem, plan, perf)
    if ev.violations:
        raise RuntimeError("anytime plan failed the evaluator: " + "; ".join(ev.violations))
    value = obj.value(ev)
    if side is not None and side.value < value * (1 - 1e-12):  # the bounded columns' plan (its own orders)
        ev, value, source = side.evaluation, side.value, side.stats.name
    if bound is not None:
        bound = min(bound, value)  # the plan's own value bounds the optimum from above
    stats.time_s = time.perf_counter() - t0
    n_cls = len(problem.classes)
    mode = f"anytime ({source})"
    notes.append(f"{len(problem.sessions)} sessions in {n_cls} class{'es' if n_cls != 1 else ''} by exact equality; "
                 f"plan from {source}; "
                 f"exact part: {exact}; bound: " +
                 (f"LP relaxation (HiGHS, {lp.solves} solves)" if bound is not None else
                  f"none (the {obj.name} objective has no LP bound)" if obj.search not in ("cost", "makespan") and
                  obj.lp_bound is None else "none reached in time"))
    status = Status.OPTIMAL if bound is not None and bound >= value * (1 - cfg.optimal_gap) else Status.FEASIBLE
    stats.status = status
    out = finish(status, obj, value, bound, ev, stats, allowed, mode)
    out.notes = notes + out.notes
    out.method = f"anytime search ({source})"
    out.bound_method = bound_source if bound is not None else ""
    return out


def _packings(A, lp, mix, deadline: float, cfg: AnytimeSettings = DEFAULT) -> list:
    """Plans by :meth:`~optimizer.deployment.anytime.Anytime.pack` at makespan targets a little
    above the LP solution's (``cfg.pack_slack``), on the LP's instance mix rounded to whole instances
    and on every single-kind mix, each run under the better batch limit rule; stops at
    ``deadline``."""
    mixes = [(A.round_mix(mix), mix.prefer(A.problem))] if mix is not None else []
    mixes += [(m, None) for m in A.single_kind_mixes()]
    out = []
    for f in cfg.pack_slack:
        for m, pref in mixes:
            if out and time.perf_counter() >= deadline:
                return out
            if not m:
                continue
            sol = A.pack(m, lp.best_T * f, pref, deadline=deadline)
            if sol is not None:
                out.append(A.choose_rule(sol))
    return out


def fewest_gpus(A, lp, lo: int, hi: int, deadline: float) -> list:
    """Objective gpus: bisection on a GPU budget g between the LP bound ``lo`` and the
    incumbent's ``hi`` GPUs. At each g, the LP without a makespan limit
    (:meth:`~optimizer.deployment.anytime.BoundLP.max_on_time` with ``gpus=g``) gives a mix,
    rounded to whole instances within g (largest remainders first), and every single-kind mix
    of g GPUs is tried too; earliest-deadline list scheduling
    (:meth:`~optimizer.deployment.anytime.Anytime.greedy`) and, one at a time, earliest-deadline
    best fit (:meth:`~optimizer.deployment.anytime.Anytime.most_on_time`) build plans; g is met
    when one meets the on-time requirement. Returns the plans that met it (``hi`` shrinks to
    each), until ``deadline``."""
    out = []
    lo, hi = max(1, lo), hi - 1
    while lo <= hi and time.perf_counter() < deadline:
        g = (lo + hi) // 2
        _, mix = lp.max_on_time(math.inf, g)
        mixes = ([A.round_mix(mix, g)] if mix is not None else []) + A.single_kind_mixes(g)
        met = None
        for m in [m for m in mixes if m]:
            if met is not None or time.perf_counter() >= deadline:
                break
            for build in (lambda: A.greedy(dict(m)), lambda: A.most_on_time(dict(m), deadline)):
                sol = build()
                sol = A.choose_rule(sol) if sol is not None else None
                if sol is not None and math.isfinite(A.score(sol)):
                    met = sol
                    break
        if met is not None:
            out.append(met)
            hi = min(g, int(A.score(met))) - 1
        else:
            lo = g + 1
    return out


def _mix_neighbours(A, m: dict, cfg: AnytimeSettings = DEFAULT):
    """The mixes one move away from ``m`` (instances per kind): give up s ∈ cfg.mix_steps instances
    of one kind and fill the free GPUs with instances of another."""
    G = A.problem.total_gpus
    gp = [k.gpus for k in A.kinds]
    for a in range(len(gp)):
        for b in range(len(gp)):
            for s in cfg.mix_steps:
                if a == b or m.get(a, 0) < s:
                    continue
                mm = dict(m)
                mm[a] -= s
                free = G - sum(gp[k] * n for k, n in mm.items())
                if free >= gp[b]:
                    mm[b] = mm.get(b, 0) + free // gp[b]
                    yield {k: n for k, n in mm.items() if n > 0}


def most_on_time_mix(A, deadline: float, cfg: AnytimeSettings = DEFAULT):
    """When list scheduling misses the on-time requirement (one-at-a-time kinds): hill
    climbing over instance mixes (:func:`_mix_neighbours`, from every single-kind mix) on the
    on-time count of
    :meth:`~optimizer.deployment.anytime.Anytime.most_on_time`, until the requirement is met or
    ``deadline``. Returns the plan with the most sessions on time (then the better objective
    value), or None (batched kinds, or no plan fits the memory)."""
    if any(k.batch_cap != 1 for k in A.kinds):
        return None
    seen: dict = {}

    def score(m):
        kk = tuple(sorted(m.items()))
        if kk not in seen:
            sol = A.most_on_time(dict(kk), deadline)
            if sol is None:
                return (-1, math.inf, None)  # not kept: may be a deadline, not the mix
            r = A.scenario(sol)
            seen[kk] = (r.on_time, A.value_of(r), sol)
        return seen[kk]

    def rank(t):
        return (t[0], -t[1])

    starts = A.single_kind_mixes()
    starts.sort(key=lambda m: rank(score(m)), reverse=True)  # the climb from the best start first

    def met() -> bool:
        return max((v[0] for v in seen.values()), default=-1) >= A.need

    for m in starts:
        cur = score(m)
        while time.perf_counter() < deadline and not met():
            top = None
            for mm in _mix_neighbours(A, m, cfg):
                if time.perf_counter() >= deadline:
                    break
                sc = score(mm)
                if top is None or rank(sc) > rank(top[0]):
                    top = (sc, mm)
                if sc[0] >= A.need:
                    break  # the requirement is met: the objective is the later steps' work
            if top is None or rank(top[0]) <= rank(cur):
                break
            cur, m = top
        if time.perf_counter() >= deadline or met():
            break
    best = max(seen.values(), key=rank, default=None)
    return best[2] if best is not None else None


def mix_search(A, T: float, starts: list, incumbent, deadline: float, cfg: AnytimeSettings = DEFAULT) -> list:
    """Best-improvement hill climbing over instance mixes (instances per kind), from ``starts``
    (e.g. the LP mix rounded) and the incumbent's mix.

    A mix is scored by its best plan among :meth:`~optimizer.deployment.anytime.Anytime.pack`
    and :meth:`~optimizer.deployment.anytime.Anytime.greedy` at the makespan targets
    ``T·cfg.mix_pack`` and ``T·cfg.mix_greedy`` (T: the LP solution's makespan, s), each simulated
    (the objective's value).
    A move gives up s ∈ cfg.mix_steps instances of one kind and fills the free GPUs with instances
    of another. The LP's fractional mix says which kinds pay, not how many whole instances
    of each pack the sessions well (on the 200-distinct benchmark the rounded LP mix scored
    1.31 and the climb reached 1.11 in 67 mixes); the local search then starts from the best.

    Returns:
        list of plans (lists of ``Inst``), best first, one per mix scored (ends at ``deadline``,
        a ``time.perf_counter()`` value); empty when one packing, timed on the first start,
        says that scoring the starts and one neighbourhood would not fit the time left.
    """
    seen: dict = {}

    def key(m):
        return tuple(sorted((k, n) for k, n in m.items() if n > 0))

    def score(m) -> float:
        kk = key(m)
        if kk not in seen:
            best = (math.inf, None)
            for f, build in [(f, A.pack) for f in cfg.mix_pack] + [(f, A.greedy) for f in cfg.mix_greedy]:
                if time.perf_counter() >= deadline:
                    break
                sol = build(dict(kk), T * f)
                if sol is None:
                    continue
                sol = A.choose_rule(sol)
                v = A.value_of(A.scenario(sol))
                if v < best[0]:
                    best = (v, sol)
            seen[kk] = best
        return seen[kk][0]

    def neighbours(m):
        return _mix_neighbours(A, m, cfg)

    own = {}
    for it in incumbent or []:
        own[it.kind] = own.get(it.kind, 0) + 1
    starts = [m for m in starts + ([own] if own else []) if m]
    if not starts:
        return []
    # a climb step scores every neighbour: not worth starting when one step does not fit the
    # budget (on 5,000 requests a packing takes ~1.7 s, a step ~50 mixes of 7 plans each)
    t = time.perf_counter()
    A.pack(dict(key(starts[0])), T * cfg.mix_pack[0], deadline=deadline)
    per_plan = time.perf_counter() - t
    steps = sum(1 for _ in neighbours(starts[0]))
    if per_plan * (len(cfg.mix_pack) + len(cfg.mix_greedy)) * (len(starts) + steps) > deadline - t:
        return []
    for m in starts:
        cur, cv = m, score(m)
        while time.perf_counter() < deadline:
            nb = [(score(mm), n, mm) for n, mm in enumerate(neighbours(cur)) if time.perf_counter() < deadline]
            if not nb or min(nb)[0] >= cv * (1 - 1e-9):
                break
            cv, _, cur = min(nb)
    ranked = sorted((v, n, sol) for n, (v, sol) in enumerate(seen.values()) if sol is not None and math.isfinite(v))
    return [sol for *_, sol in ranked]


def _horizon(problem: Problem, A) -> float:
    """A makespan (s) no plan needs to exceed: every session one after another on its slowest
    kind (so a threshold at it limits nothing)."""
    return float(sum(c.count for c in problem.classes)) * max(
        float(np.max(np.where(np.isfinite(k.alone), k.alone, 0.0))) for k in A.kinds) + 1.0


def most_on_time_plan(problem: Problem, A, deadline: float):
    """When list scheduling misses the on-time requirement: the configuration LP's integer
    master at an unlimited makespan (the most sessions on time it finds), or None (it does not
    apply, or its plan misses the requirement too)."""
    from optimizer.deployment.colgen import ConfigLP

    cg = ConfigLP.for_problem(problem, A.kinds)
    if cg is None or time.perf_counter() >= deadline:
        return None
    T = _horizon(problem, A)
    need = A.need
    u = cg.upper(T, time.perf_counter() + 0.7 * max(0.0, deadline - time.perf_counter()))
    if u is not None and u < need - 1e-6:
        return None  # not even the configuration LP reaches the requirement
    got = cg.integer_plan(T, deadline)
    if not got:
        return None
    sol = A.choose_rule(A.from_classes(got))
    return sol if A.scenario(sol).on_time >= need else None


def _decide_by_aggregate(problem: Problem, perf, obj, A, allowed, verdict, deadline: float):
    """The LP relaxation neither proves nor rules out a plan with the on-time requirement: the
    aggregate CP-SAT model (:func:`optimizer.deployment.exact.aggregate_feasibility`, exact
    without faults for plain TP) decides it by ``deadline`` where it can.

    Returns:
        (an infeasible SolveOutcome, None) when proven that no plan exists; (None, the model's
        plan as instances of ``A``) when it finds one; (None, None) when undecided or not
        applicable (layouts, batched decode).
    """

    if not problem.tp_only or problem.faults or time.perf_counter() >= deadline:
        return None, None
    usable = usable_degrees(problem, perf, allowed)
    stats = verdict.stats
    found: list = []
    got = aggregate_feasibility(problem, perf, usable, obj, deadline, stats, found)
    if got is False:
        need = max(problem.required_on_time, obj.min_on_time)
        stats.status = Status.INFEASIBLE
        stats.name = "anytime (list scheduling, HiGHS LP bound; CP-SAT feasibility)"
        out = SolveOutcome(Status.INFEASIBLE, obj, None, None, None, stats, allowed, "aggregate (feasibility)")
        out.notes.append(f"the aggregate CP-SAT model proves no plan has {need} of {len(problem.sessions)} "
                         f"sessions on time (the LP relaxation allowed it)")
        return out, None
    if got and found:
        return None, A.from_plan(found[0])
    return None, None


def repair_on_time(A, start, deadline: float):
    """A plan that meets the on-time requirement, searched from ``start`` (short of it) by
    LNS whose steps each put at least one more session on time (:attr:`Anytime.repairing`),
    until the requirement holds or ``deadline``; None if it does not by then."""
    A.repairing = True
    try:
        got = lns(A, start, deadline, bound=0.5 * at.SHORTFALL_PENALTY)
    finally:
        A.repairing = False
    return got if A.scenario(got).on_time >= A.need else None


def _no_plan(problem: Problem, perf, obj, A, allowed, t0: float, deadline: float, cfg: AnytimeSettings = DEFAULT):
    """No constructive plan meets the on-time requirement: small problems go to the exact
    formulations (None: they decide and explain); for large ones the LP relaxation without a
    makespan limit may prove that no plan exists (infeasible), else the solve ends with
    ``time_limit`` and the LP's on-time figure."""

    if len(problem.sessions) <= cfg.small_sessions:
        return None  # the exact formulations decide and explain (e.g. the most sessions on time)
    out, most = _lp_verdict(problem, perf, obj, A, allowed, t0)
    if out is not None:
        return out
    need = max(problem.required_on_time, obj.min_on_time)
    stats = SolverStats("anytime (list scheduling, HiGHS LP bound)", Status.TIME_LIMIT, time.perf_counter() - t0)
    out = SolveOutcome(Status.TIME_LIMIT, obj, None, None, None, stats, allowed, "anytime")
    out.notes.append(f"no plan with {need} sessions on time found by list scheduling and LNS repair within the time limit; "
                     f"the LP relaxation allows "
                     f"up to {max(0.0, most):.1f}")
    return out


def nominal_lp_verdict(problem: Problem, perf, obj, degrees=None, layouts=None):
    """The LP relaxation's verdict on ``problem`` (no faults): an INFEASIBLE
    :class:`~optimizer.deployment.outcome.SolveOutcome` when it proves that no plan places every
    session or meets the on-time requirement, else None. A fault only delays, so a fault
    instance whose run without faults is infeasible is infeasible too."""
    allowed, lays = anytime_layouts(problem, perf, degrees, layouts)
    A = at.Anytime(problem, perf, obj, lays)
    if not A.kinds:
        return None
    return _lp_verdict(problem, perf, obj, A, allowed, time.perf_counter())[0]


def anytime_layouts(problem: Problem, perf, degrees=None, layouts=None) -> tuple[tuple, list]:
    """(allowed TP degrees, layouts) the anytime path works with: the usable TP degrees of a
    TP-only problem (``degrees``, default the problem's), else the problem's layouts (or
    ``layouts``)."""

    if problem.tp_only:
        allowed = tuple(problem.degrees if degrees is None else degrees)
        return allowed, [Layout.tp(p) for p in usable_degrees(problem, perf, allowed)]
    return tuple(problem.degrees), list(problem.layouts if layouts is None else layouts)


def _lp_verdict(problem: Problem, perf, obj, A, allowed, t0: float):
    """(INFEASIBLE outcome or None, the LP's most sessions on time at any makespan); where the LP
    places every session, the KV-memory bound :func:`~optimizer.deployment.params.kv_gpus_needed`
    (KV held for the whole run, which the LP's memory-time rows do not require) may still prove
    that they do not fit."""

    need = max(problem.required_on_time, obj.min_on_time)
    lp = at.BoundLP(problem, perf, A.kinds)
    most, _ = lp.max_on_time(_horizon(problem, A))  # every session one after another: no tighter T
    stats = SolverStats("anytime (list scheduling, HiGHS LP bound)", Status.INFEASIBLE, 0.0, solves=lp.solves)
    stats.time_s = time.perf_counter() - t0
    if most < 0:
        out = SolveOutcome(Status.INFEASIBLE, obj, None, None, None, stats, allowed, "anytime (LP relaxation)")
        out.notes.append(f"the LP relaxation proves the {len(problem.sessions)} sessions cannot all be placed "
                         f"(KV memory of the instances that fit the GPUs)")
        return out, most
    stats.name = "anytime (KV memory bound)"
    out = _kv_memory_verdict(problem, perf, obj, allowed, stats, t0)
    if out is not None:
        return out, -1.0
    stats.name = "anytime (list scheduling, HiGHS LP bound)"
    if most < need - 1e-6:
        out = SolveOutcome(Status.INFEASIBLE, obj, None, None, None, stats, allowed, "anytime (LP relaxation)")
        out.notes.append(f"the LP relaxation proves at most {max(0.0, most):.1f} of {len(problem.sessions)} sessions "
                         f"can be on time; {need} required")
        return out, most
    return None, most


def _kv_memory_verdict(problem: Problem, perf, obj, allowed, stats: SolverStats, t0: float):
    """INFEASIBLE when the sessions' KV caches need more GPUs than there are
    (:func:`~optimizer.deployment.params.kv_gpus_needed`), else None; ``stats`` is the outcome's."""
    gpus = kv_gpus_needed(problem, perf, allowed)
    if gpus is None or gpus <= problem.total_gpus * (1 + 1e-9):
        return None
    stats.time_s = time.perf_counter() - t0
    out = SolveOutcome(Status.INFEASIBLE, obj, None, None, None, stats, allowed, "anytime (KV memory bound)")
    out.notes.append(f"KV memory: the {len(problem.sessions)} sessions' KV caches, each held for the whole run, "
                     f"need at least {gpus:,.1f} GPUs of room next to the weights; {problem.total_gpus} GPUs given")
    return out
