"""The exact formulations of the deployment problem (configuration LP/MILP, ordered columns,
compact aggregate and sequence CP-SAT with Dinkelbach for ratio objectives, batched
configurations), chosen by :func:`solve_exact`; every plan is re-checked by the independent
evaluator. The solve strategy (:mod:`optimizer.deployment.strategy`) runs them as the method
``exact formulations`` and the anytime search runs them on small instances."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Optional

from objectives.deployment import get as get_objective
from objectives.deployment import registry as objective_registry
from objectives.deployment.base import DeploymentObjective, ratio_of
from objectives.deployment.makespan import OBJECTIVE as MAKESPAN
from objectives.deployment.makespan import worst_makespan
from optimizer.cpsat import solve_cp
from optimizer.deployment.configurations import (ConfigurationSearch, chain_degrees, enumerate_configurations,
                                                 moore_hodgson_order)
from optimizer.deployment.evaluate import Evaluation, Plan, PlannedInstance, evaluate
from optimizer.deployment.fault_columns import enumerate_columns, solve_columns
from optimizer.deployment.formulation import Formulation
from optimizer.deployment.outcome import SolveOutcome, finish, resolve_objective
from optimizer.deployment.packing import pack_on_servers
from optimizer.deployment.params import build_options, degree_fits_hardware, degree_fits_model, usable_degrees
from optimizer.deployment.progress import Progress
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import Problem
from optimizer.deployment.units import deadline_ticks, ticks_up
from optimizer.errors import InputError
from optimizer.result import SolverStats, Status, relative_gap

def choose_mode(problem: Problem, objective) -> str:
    """``sequence`` when order matters beyond EDD (faults, latency), else ``aggregate``."""
    return "sequence" if (problem.faults or get_objective(objective).needs_sequence) else "aggregate"


def build(problem: Problem, perf: PerfModel, degrees, objective, explain: bool = False,
          deadline: Optional[float] = None) -> Formulation:
    """The CP-SAT formulation for ``objective`` (raises BuildTimeout past ``deadline``)."""
    obj = get_objective(objective)
    mode = choose_mode(problem, obj)
    f = Formulation(problem, perf, degrees, mode, latency=obj.needs_sequence, explain=explain, deadline=deadline)
    f.required = max(f.required, obj.min_on_time)
    return f.build()


def solve_exact(problem: Problem, obj, deadline: float, degrees=None, perf: Optional[PerfModel] = None,
                layouts=None, progress: Optional[Progress] = None, bounded: bool = True) -> SolveOutcome:
    """The exact formulations (configuration search, ordered columns, compact and sequence
    CP-SAT, bounded columns), chosen automatically; ``deadline`` is a ``time.perf_counter()``
    value; ``progress`` gets the CP-SAT and Dinkelbach improvements; ``bounded`` False skips the
    bounded column search (the caller ran it already)."""
    perf = perf or PerfModel(problem)
    progress = progress or Progress.off()
    limit = max(0.05, deadline - time.perf_counter())
    if not problem.tp_only:
        return solve_batched(problem, perf, obj, deadline, tuple(problem.layouts if layouts is None else layouts),
                             bounded)
    allowed = tuple(problem.degrees if degrees is None else degrees)
    usable = usable_degrees(problem, perf, allowed)
    mode = choose_mode(problem, obj)
    stats = SolverStats("cp-sat", Status.INFEASIBLE, 0.0, solves=0)
    if not usable:
        return SolveOutcome(Status.INFEASIBLE, obj, None, None, None, stats, allowed, mode)

    def remaining() -> float:
        return max(0.05, deadline - time.perf_counter())

    if mode == "sequence" and obj.search and _columns_apply(problem, usable):
        done = _solve_with_columns(problem, perf, usable, obj, deadline, stats, allowed)
        if done is not None:
            return done
    found: list = []
    if mode == "sequence":
        # whether any plan exists does not depend on the objective: the aggregate model decides
        # it fast where the sequence model may spend its whole limit on an infeasible instance.
        # With faults it checks the nominal run, which the on-time requirement covers too: no
        # plan there, no plan at all.
        from dataclasses import replace

        nominal = replace(problem, faults=()) if problem.faults else problem
        verdict = aggregate_feasibility(nominal, perf, usable, obj, time.perf_counter() + FEASIBILITY_SHARE * limit,
                                         stats, found)
        if verdict is False:
            out = SolveOutcome(Status.INFEASIBLE, obj, None, None, None, stats, allowed, "aggregate (feasibility)")
            if problem.faults:
                out.notes.append("no plan meets the on-time requirement even without a fault (the nominal run), "
                                 "so none does with the faults")
            return out
    seed_plan = None
    if mode == "sequence" and chain_degrees(problem, usable):
        seed_plan = _nominal_seed_plan(problem, perf, usable, obj, min(remaining() * 0.2, 5.0))
    if seed_plan is None and mode == "sequence" and not problem.faults and found:
        seed_plan = found[0]  # the feasibility check's plan warm-starts the sequence model
    if mode == "aggregate" and obj.search and chain_degrees(problem, usable):
        done = _solve_with_configurations(problem, perf, usable, obj, deadline, stats, allowed)
        if done is not None:
            return done
    if obj.kind != "ratio":
        return _solve_direct(problem, perf, usable, obj, deadline, stats, allowed, mode, seed_plan, progress)

    # ratio objectives: phase 1, a plan of small worst-case makespan (a short share of the
    # budget) whose makespan bound may also bound the ratio; then Dinkelbach iterations.
    f, late = _build_in_time(problem, perf, usable, obj, deadline, stats, allowed, mode)
    if f is None:
        return late
    MAKESPAN.apply(f)
    if seed_plan is not None:
        hint_from_plan(f, seed_plan)
    out = solve_cp(f.model, min(remaining(), max(2.0, 0.25 * limit)))
    if out.status == Status.TIME_LIMIT and remaining() > 0.1:
        out = solve_cp(f.model, remaining())  # no plan yet: keep looking
        stats.solves += 1
    stats.time_s += out.time_s
    stats.solves += 1
    if out.status in (Status.INFEASIBLE, Status.TIME_LIMIT):
        stats.status = out.status
        return SolveOutcome(out.status, obj, None, None, None, stats, allowed, mode)
    lam = ratio_of(obj, f, out.solver)
    bound_ratio = obj.numerator_bound(problem, int(out.bound))
    best_plan, lam, bound_ratio, proven = _dinkelbach(problem, perf, usable, obj, lam, bound_ratio, out, f,
                                                       deadline, stats, progress)
    ev = evaluate(problem, best_plan, perf)
    value = obj.value(ev)
    bound = min(obj.ratio_in_unit(problem, bound_ratio), value)  # the evaluated plan bounds the optimum too
    if bound < value * (1 - 1e-9):  # not met: stay valid despite service ticks rounded up
        bound = max(0.0, bound - obj.rounding_slack(problem))
    elif proven:
        bound = min(value, bound)  # exact arithmetic may shave the tick rounding
    status = Status.OPTIMAL if proven and bound >= value * (1 - 1e-9) else Status.FEASIBLE
    out = finish(status, obj, value, bound, ev, stats, allowed, mode)
    if out.status != Status.OPTIMAL and problem.faults and obj.fault_note:
        out.notes.append(obj.fault_note)
    return out


FEASIBILITY_SHARE = 0.25  # share of the exact solve's budget for the aggregate feasibility check


def aggregate_feasibility(problem: Problem, perf: PerfModel, usable, obj, deadline: float,
                           stats: SolverStats, plans: Optional[list] = None) -> Optional[bool]:
    """Whether any plan places every session and meets the on-time requirement (no faults).

    The aggregate CP-SAT model without an objective: the EDD prefix condition is exact for the
    on-time count without faults (Moore-Hodgson), so its verdict holds for every objective,
    latency included. ``deadline`` is a ``time.perf_counter()`` value; the solve is counted
    in ``stats``; when a plan is found and ``plans`` is a list, the plan is appended to it.
    Returns:
        False when proven infeasible, True when a plan exists, None when undecided in time.
    """
    from optimizer.deployment.formulation import BuildTimeout

    if problem.faults:
        raise ValueError("the aggregate feasibility check is exact only without faults")
    try:
        f = Formulation(problem, perf, usable, "aggregate", deadline=deadline)
        f.required = max(f.required, get_objective(obj).min_on_time)
        f.build()
    except BuildTimeout:
        return None
    out = solve_cp(f.model, max(0.01, deadline - time.perf_counter()))
    stats.time_s += out.time_s
    stats.solves += 1
    if out.status == Status.INFEASIBLE:
        return False
    if out.status not in (Status.OPTIMAL, Status.FEASIBLE):
        return None
    if plans is not None:
        plans.append(extract_plan(f, out.solver))
    return True


SERVERS_CHECK_SESSIONS = 60  # servers_to_fit runs up to this many sessions (its models grow with the servers)


def servers_to_fit(problem: Problem, objective, deadline: float) -> Optional[int]:
    """The fewest servers (same server type, same allowed degrees) with which a plan meets
    every limit, when the instance is infeasible as given; None when no server count helps (the
    GPU count does not bind), with faults, above ``SERVERS_CHECK_SESSIONS`` sessions (a fresh
    user's 2,000 sessions on 32 servers had it build models for up to 64,032 servers, 12 GB and
    11 minutes past a 10 s limit), or when the checks do not finish by ``deadline`` (model
    building included).

    Every check is the aggregate feasibility model (:func:`aggregate_feasibility`). Feasibility
    only grows with servers, and with ``servers + ceil(N·p_max/G)`` servers every session can
    run alone on an instance of any allowed degree (the most any plan can use), so when that
    count fails none helps; otherwise the smallest count is found by bisection.
    """
    from dataclasses import replace

    if problem.faults or not problem.tp_only or len(problem.sessions) > SERVERS_CHECK_SESSIONS:
        return None
    G, n = problem.server.gpus, len(problem.sessions)
    top = problem.servers + math.ceil(n * max(problem.degrees) / G)
    stats = SolverStats("servers", Status.INFEASIBLE, 0.0, solves=0)

    def fits(servers: int) -> Optional[bool]:
        p2 = replace(problem, servers=servers)
        perf = PerfModel(p2)
        usable = usable_degrees(p2, perf, p2.degrees)
        if not usable:
            return False
        if time.perf_counter() >= deadline:
            return None
        return aggregate_feasibility(p2, perf, usable, objective, deadline, stats)

    ok = fits(top)
    if not ok:
        return None
    lo, hi = problem.servers, top  # lo: infeasible (as given); hi: feasible
    while hi - lo > 1:
        mid = (lo + hi) // 2
        got = fits(mid)
        if got is None:
            return None
        lo, hi = (lo, mid) if got else (mid, hi)
    return hi


def _build_in_time(problem, perf, usable, obj, deadline, stats, allowed, mode):
    """(the formulation, None), or (None, a TIME_LIMIT outcome without a plan) when building
    it reaches ``deadline`` (:class:`~optimizer.deployment.formulation.BuildTimeout`)."""
    from optimizer.deployment.formulation import BuildTimeout

    try:
        return build(problem, perf, usable, obj, deadline=deadline), None
    except BuildTimeout as exc:
        stats.status = Status.TIME_LIMIT
        out = SolveOutcome(Status.TIME_LIMIT, obj, None, None, None, stats, allowed, mode)
        out.notes.append(f"{exc}: no plan (the {obj.name} objective uses the {mode} formulation)")
        return None, out


def _solve_direct(problem, perf, usable, obj, deadline, stats, allowed, mode, seed_plan, progress) -> SolveOutcome:
    """One CP-SAT solve of the compact/sequence formulation with the objective set directly
    (makespan, energy, latency); for ``count`` objectives a second solve with the count fixed
    picks the smallest makespan among the optimal plans."""
    f, late = _build_in_time(problem, perf, usable, obj, deadline, stats, allowed, mode)
    if f is None:
        return late
    obj.apply(f)
    if seed_plan is not None:
        hint_from_plan(f, seed_plan, spt=obj.kind == "finish_sum")
    left = max(0.05, deadline - time.perf_counter())
    share = left * 0.7 if obj.kind == "count" else left
    out = solve_cp(f.model, share, workers=_workers(f) if obj.kind == "finish_sum" else 2,
                   on_solution=_cp_progress(problem, obj, progress))
    stats.time_s += out.time_s
    stats.solves += 1
    if out.status in (Status.INFEASIBLE, Status.TIME_LIMIT):
        stats.status = out.status
        return SolveOutcome(out.status, obj, None, None, None, stats, allowed, mode)
    bound = obj.bound_in_unit(problem, out.bound)
    solver = out.solver
    if obj.kind == "count" and out.status == Status.OPTIMAL:
        count = int(round(out.objective))
        f2 = build(problem, perf, usable, obj)
        f2.model.add(obj.expression(f2) == count)
        f2.model.minimize(worst_makespan(f2))
        _add_hint(f2, _solution(solver, f))
        out2 = solve_cp(f2.model, max(0.05, deadline - time.perf_counter()))
        stats.time_s += out2.time_s
        stats.solves += 1
        if out2.status in (Status.OPTIMAL, Status.FEASIBLE):
            f, solver = f2, out2.solver
    plan = extract_plan(f, solver)
    ev = evaluate(problem, plan, perf)
    value = obj.value(ev)
    return finish(out.status, obj, value, min(bound, value), ev, stats, allowed, mode)


def _cp_progress(problem, obj, progress: Progress):
    """``--progress`` for a CP-SAT solve with the objective set directly: each improving
    solution's objective and proven bound, in the objective's unit (None without a display)."""
    if not progress.active:
        return None
    return lambda o, b: progress.report("cp-sat", obj.bound_in_unit(problem, o), obj.bound_in_unit(problem, b))


def _ratio_progress(problem, obj, lam, bound_ratio, progress: Progress) -> None:
    """``--progress`` for a Dinkelbach iteration: the ratio reached and the proven bound."""
    if not progress.active:
        return
    b = None if bound_ratio is None else max(0.0, obj.ratio_in_unit(problem, bound_ratio) - obj.rounding_slack(problem))
    progress.report("Dinkelbach", obj.ratio_in_unit(problem, lam), b)


def _dinkelbach(problem, perf, usable, obj, lam, bound_ratio, out, f, deadline, stats, progress):
    """Dinkelbach iterations on the compact formulation (ratio objectives)."""
    from optimizer.deployment.formulation import BuildTimeout

    best_f, best_solver = f, out.solver
    proven = False
    hint = _solution(out.solver, f)
    _ratio_progress(problem, obj, lam, bound_ratio, progress)
    while time.perf_counter() < deadline:
        try:
            f = build(problem, perf, usable, obj, deadline=deadline)
        except BuildTimeout:
            break  # the limit came while building: the best plan so far stands
        obj.apply(f, lam)
        _add_hint(f, hint)
        out = solve_cp(f.model, max(0.05, deadline - time.perf_counter()))
        stats.time_s += out.time_s
        stats.solves += 1
        if out.status not in (Status.OPTIMAL, Status.FEASIBLE):
            break
        new_lam = ratio_of(obj, f, out.solver)
        if out.status == Status.OPTIMAL and out.objective >= 0:
            proven = True
            bound_ratio = lam
            break
        # the objective's proven bound gives a bound on the optimal ratio
        fb = min(0.0, out.bound) / lam.denominator
        rmin = max(1, f.required)
        cand = lam + Fraction(fb).limit_denominator(10 ** 6) / rmin
        bound_ratio = max(bound_ratio, cand)
        if new_lam < lam:
            lam, best_f, best_solver = new_lam, f, out.solver
            hint = _solution(out.solver, f)
            _ratio_progress(problem, obj, lam, bound_ratio, progress)
        else:
            break  # no progress within the time limit
    return extract_plan(best_f, best_solver), lam, bound_ratio, proven


def _columns_apply(problem: Problem, usable) -> bool:
    """The ordered-column formulation is exact here: chain degrees and faults naming at most
    one distinct GPU."""
    return chain_degrees(problem, usable) and len({f.gpu for f in problem.faults if f.gpu is not None}) <= 1


def _solve_with_columns(problem, perf, usable, objective, deadline, stats, allowed):
    """Ordered-column formulation for faults on any GPU (:mod:`optimizer.deployment.fault_columns`);
    None to fall back to the sequence formulation (too many columns, or no plan in time)."""
    t0 = time.perf_counter()
    cols = enumerate_columns(problem, build_options(problem, perf, usable), deadline=deadline)
    if not cols:
        return None
    res = solve_columns(problem, cols, objective.search, max(problem.required_on_time, objective.min_on_time),
                        deadline)
    stats.time_s += time.perf_counter() - t0
    if res is None:
        return None
    stats.solves += res.solves
    stats.name = "cp-sat (ordered columns)"
    if res.plan is None:  # proven: no plan meets the limits
        stats.status = Status.INFEASIBLE
        return SolveOutcome(Status.INFEASIBLE, objective, None, None, None, stats, allowed, "ordered columns")
    pools = {c.index: list(c.session_ids) for c in problem.classes}
    used, host = res.plan
    items, host_item = [], None
    for col, k in used:
        for _ in range(k):
            if col is host and host_item is None:
                host_item = len(items)
            items.append((col.degree, [pools[c].pop(0) for c in col.order]))
    plan = pack_on_servers(problem, items)
    named = next((f.gpu for f in problem.faults if f.gpu is not None), None)
    if named is not None:
        host_id = None
        if host_item is not None:  # pack_on_servers sorts by degree (stable): find the same instance
            first = items[host_item][1][0]
            host_id = next(i.id for i in plan.instances if i.sessions and i.sessions[0] == first)
        plan = place_named_gpu(problem, plan, named, host_id)
    ev = evaluate(problem, plan, perf)
    value = objective.value(ev)
    bound = None
    if res.bound is not None:
        bound = _search_bound_in_unit(problem, objective, res.bound)
    if res.proven:
        bound = min(value, bound)
    return finish(Status.OPTIMAL if res.proven else Status.FEASIBLE, objective, value, bound, ev, stats, allowed,
                   "ordered columns")


def place_named_gpu(problem: Problem, plan: Plan, gpu: int, host: Optional[str]) -> Plan:
    """Relabel servers and GPUs (all interchangeable) so that GPU ``gpu`` belongs to
    instance ``host``, or is idle when ``host`` is None."""
    G = problem.server.gpus
    s_g, local = divmod(gpu, G)
    owner = {g: inst.id for inst in plan.instances for g in inst.gpus}
    if host is not None:
        src_gpu = next(g for inst in plan.instances if inst.id == host for g in inst.gpus)
    else:
        src_gpu = next((g for g in range(problem.total_gpus) if g not in owner), None)
        if src_gpu is None:
            raise RuntimeError("no idle GPU for the named fault")
    s_src, l_src = divmod(src_gpu, G)
    perm_server = list(range(problem.servers))
    perm_server[s_src], perm_server[s_g] = perm_server[s_g], perm_server[s_src]

    def relabel(g: int) -> int:
        s, l = divmod(g, G)
        s = perm_server[s]
        if s == s_g:
            l = local if l == l_src else (l_src if l == local else l)
        return s * G + l

    out = []
    for inst in plan.instances:
        gpus = tuple(sorted(relabel(g) for g in inst.gpus))
        servers = tuple(sorted({g // G for g in gpus}))
        out.append(PlannedInstance(inst.id, inst.degree, servers, gpus, inst.sessions))
    return Plan(out)


def _configuration_cache(problem: Problem, perf: PerfModel) -> list:
    """Enumerations of the configuration search kept on the problem's PerfModel, which the main
    solve and its comparison rows share: [(degrees, ub ticks, configurations)] for this
    problem's classes, servers and on-time requirement."""
    key = (tuple((c.context, c.new, c.deadline_s, c.count) for c in problem.classes), problem.servers,
           problem.min_on_time_fraction, problem.reserve_bytes)
    store = perf.__dict__.setdefault("_configuration_cache", {})
    return store.setdefault(key, [])


def _cached_configurations(problem: Problem, perf: PerfModel, options, ub: int):
    """The configurations of ``options``' degrees with load ≤ ``ub`` from an enumeration already
    made over a superset of the degrees up to at least ``ub`` (the main solve's, for a comparison
    row), else None: a configuration depends only on its degree's constants, so the filter is
    the enumeration (warm rows, issue #25 item 4)."""
    want = set(options)
    for degrees, top, configs in _configuration_cache(problem, perf):
        if want <= set(degrees) and top >= ub:
            return [c for c in configs if c.degree in want and c.load <= ub]
    return None


def _cache_configurations(problem: Problem, perf: PerfModel, options, ub: int, configs) -> None:
    cache = _configuration_cache(problem, perf)
    cache.append((tuple(options), ub, configs))
    if len(cache) > 4:
        del cache[0]


def warm_row(problem: Problem, perf: PerfModel, objective, degree: int, deadline: float) -> Optional[SolveOutcome]:
    """A comparison row of one TP degree from the configurations the main solve enumerated
    (:func:`_cached_configurations`) and the configuration search alone, without the anytime
    phases; None when it does not prove the row's optimum (the row is then solved in full)."""
    if not _configuration_cache(problem, perf) or problem.faults or objective.search is None:
        return None
    usable = usable_degrees(problem, perf, (degree,))
    if not usable or choose_mode(problem, objective) != "aggregate" or not chain_degrees(problem, usable):
        return None
    stats = SolverStats("cp-sat", Status.INFEASIBLE, 0.0, solves=0)
    out = _solve_with_configurations(problem, perf, usable, objective, deadline, stats, (degree,))
    if out is None or out.status != Status.OPTIMAL:
        return None
    out.method = out.bound_method = f"comparison rows (warm: the main solve's configurations, {out.stats.name})"
    return out


def _solve_with_configurations(problem, perf, usable, objective, deadline, stats, allowed):
    """Configuration search (cost, makespan, energy without faults); None to fall back to
    the compact formulation (too many configurations, or no plan within the time)."""
    options = build_options(problem, perf, usable)
    n, g = len(problem.sessions), problem.total_gpus
    need = max(problem.required_on_time, objective.min_on_time)
    kind = objective.search
    if any(all(options[p].cap[c.index] == 0 for p in options) for c in problem.classes):
        return None  # a session fits no instance: the compact formulation explains why
    # a first enumeration bound from simple lower bounds on the makespan
    single = max(min(options[p].ticks[c.index] for p in options if options[p].cap[c.index] > 0)
                 for c in problem.classes)
    work = sum(c.count * min(p * options[p].ticks[c.index] for p in options if options[p].cap[c.index] > 0)
               for c in problem.classes) / g
    ub = int(1.25 * max(single, work)) + 1
    best = None  # (value Fraction, counts, makespan, on)
    bound = None
    t0 = time.perf_counter()
    # without a plan at the first load level, doubling it (more configurations each time) stops
    # at half the budget: an instance with no plan at all (e.g. a comparison row of one degree)
    # is then left to the compact model, whose aggregate form proves that quickly
    half = t0 + 0.5 * max(0.0, deadline - t0)
    for it in range(12):
        configs = _cached_configurations(problem, perf, options, ub)
        if configs is None:
            configs = enumerate_configurations(problem, options, deadline_ticks(problem.classes), ub,
                                               deadline=deadline if it == 0 or best is not None else half)
            if configs is None:
                break
            _cache_configurations(problem, perf, options, ub, configs)
        search = ConfigurationSearch(problem, configs, need, deadline)
        res = search.run(kind, best[0] if best else None)
        stats.solves += res.lp_solves + res.milp_solves
        if res.counts is not None:
            val = Fraction(g * res.makespan_ticks, res.on_time) if kind == "cost" else Fraction(res.makespan_ticks)
            if best is None or val < best[0]:
                best = (val, res.counts, res.makespan_ticks, res.on_time)
        # plans outside the enumeration have makespan > ub: cost ≥ G·ub/N, makespan > ub
        outside = Fraction(g * (ub + 1), n) if kind == "cost" else Fraction(ub + 1)
        inside = res.bound if res.bound is not None else (best[0] if best else outside)
        bound = min(inside, outside)
        if best is not None:
            reach = int(best[0] * n / g) if kind == "cost" else best[2]
            if reach <= ub or time.perf_counter() >= deadline:
                break
            ub = reach  # a better plan may need configurations up to this load
        elif time.perf_counter() >= half:
            break
        else:
            ub *= 2
    stats.time_s += time.perf_counter() - t0
    if best is None:
        return None
    stats.name = "highs (configuration LP/MILP)"
    plan = plan_from_configurations(problem, options, best[1])
    ev = evaluate(problem, plan, perf)
    value = objective.value(ev)
    proven = bound is not None and bound >= best[0]
    bnd = _search_bound_in_unit(problem, objective, bound) if bound is not None else None
    if proven:
        bnd = min(value, bnd)
    return finish(Status.OPTIMAL if proven else Status.FEASIBLE, objective, value, bnd, ev, stats, allowed,
                   "configuration")


def solve_batched(problem: Problem, perf: PerfModel, obj, deadline: float, layouts, bounded: bool = True) -> SolveOutcome:
    """Layouts and batched decode: the bounded column search where it applies and proves the
    answer (:func:`solve_bounded`), else the configuration search over (layout, batch limit,
    sessions) columns (:mod:`optimizer.deployment.batching`)."""
    from optimizer.deployment.batching import (check_supported, enumerate_batch_configurations,
                                               layout_options)
    check_supported(problem, obj)
    allowed = tuple(problem.degrees)
    if bounded and bounded_applies(problem, perf, obj):
        got = solve_bounded(problem, perf, obj, deadline, layouts)
        if got is not None and got.status in (Status.OPTIMAL, Status.INFEASIBLE):
            return got  # a claim over every admission order; else the enumeration below
    mode = "configuration (layouts, batched)"
    stats = SolverStats("highs (configuration LP/MILP)", Status.INFEASIBLE, 0.0, solves=0)
    t0 = time.perf_counter()
    options = layout_options(problem, perf, layouts)
    configs = enumerate_batch_configurations(problem, perf, options, deadline=deadline) if options else []
    if configs is None:
        stats.status = Status.TIME_LIMIT
        stats.time_s = time.perf_counter() - t0
        out = SolveOutcome(Status.TIME_LIMIT, obj, None, None, None, stats, allowed, mode)
        out.notes.append("too many configurations (layout, batch limit, sessions) to enumerate within the limits")
        return out
    covered = {c.index for c in problem.classes if any(cfg.counts[c.index] for cfg in configs)}
    if len(covered) < len(problem.classes):
        stats.time_s = time.perf_counter() - t0
        return SolveOutcome(Status.INFEASIBLE, obj, None, None, None, stats, allowed, mode)
    need = max(problem.required_on_time, obj.min_on_time)
    search = ConfigurationSearch(problem, configs, need, deadline)
    if obj.search is None:
        return _scoped(_solve_batched_additive(problem, perf, obj, search, need, deadline, stats, allowed, mode, t0),
                       configs)
    return _scoped(_solve_batched_search(problem, perf, obj, search, stats, allowed, mode, t0), configs)


def bounded_applies(problem: Problem, perf: PerfModel, obj) -> bool:
    """The bounded column search (:mod:`optimizer.deployment.bounded`) covers this problem:
    batched or layout problems without faults, a threshold objective (cost, makespan, energy),
    one batch per decode step, and few enough session sub-multisets for its cover programme."""
    from optimizer.deployment.bounded import CoverDP

    return (not problem.faults and not problem.tp_only and obj.search in ("cost", "makespan")
            and perf.model.micro_batches == 1 and CoverDP.fits(problem))


def solve_bounded(problem: Problem, perf: PerfModel, obj, deadline: float, layouts,
                  incumbent: Optional[Evaluation] = None) -> Optional[SolveOutcome]:
    """The bounded column search as a solve: optimistic columns, simulated when chosen
    (:func:`optimizer.deployment.bounded.bounded_search`). ``incumbent``: a plan already found
    (its value prunes the columns: a better plan ends by ``value·N/G`` for cost, by its makespan
    otherwise). Returns OPTIMAL (the plan found, or the incumbent proven), INFEASIBLE (no
    column set covers the sessions with the on-time requirement), FEASIBLE with the bound, or
    None when the columns cannot be enumerated in time. Claims hold over every batch limit and
    admission order (no scope)."""
    from optimizer.deployment.bounded import bounded_search
    from optimizer.deployment.units import TIME_UNIT_S

    t0 = time.perf_counter()
    allowed = tuple(problem.degrees)
    need = max(problem.required_on_time, obj.min_on_time)
    kind = obj.search
    G, N = problem.total_gpus, len(problem.sessions)
    inc_key = t_max = None
    if incumbent is not None and not incumbent.violations:
        r = incumbent.nominal
        mk_ticks = ticks_up(r.makespan_s)
        if r.on_time >= need and (kind != "cost" or r.on_time > 0):
            inc_key = Fraction(G * mk_ticks, r.on_time) if kind == "cost" else Fraction(mk_ticks)
            t_max = float(inc_key) * N / G * TIME_UNIT_S if kind == "cost" else mk_ticks * TIME_UNIT_S
    res = bounded_search(problem, perf, kind, need, deadline, tuple(layouts), inc_key, t_max)
    if res is None:
        return None
    name = "bounded columns (cover DP, simulated when chosen)" if res.rounds else "bounded columns"
    stats = SolverStats(name, Status.FEASIBLE, time.perf_counter() - t0, solves=res.rounds + res.solves)
    mode = "bounded columns (layouts, batched)"
    if res.counts is None:
        if res.infeasible:
            stats.status = Status.INFEASIBLE
            out = SolveOutcome(Status.INFEASIBLE, obj, None, None, None, stats, allowed, mode)
            out.notes += res.notes
            return out
        if incumbent is None or res.bound is None:
            stats.status = Status.TIME_LIMIT
            out = SolveOutcome(Status.TIME_LIMIT, obj, None, None, None, stats, allowed, mode)
            out.notes += res.notes
            return out
        ev = incumbent  # the incumbent stands; the search may have proven it
    else:
        plan = plan_from_batch_configurations(res.problem, perf, res.counts)
        ev = evaluate(problem, plan, perf)
    value = obj.value(ev)
    bound = _search_bound_in_unit(problem, obj, res.bound) if res.bound is not None else None
    proven = res.bound is not None and (res.proven or (res.counts is None and inc_key is not None
                                                        and res.bound >= inc_key))
    if proven:
        bound = min(value, bound)
    out = finish(Status.OPTIMAL if proven else Status.FEASIBLE, obj, value, bound, ev, stats, allowed, mode)
    out.notes += res.notes
    return out


def _scoped(out: SolveOutcome, configs) -> SolveOutcome:
    """State the decision space the claim holds over (:attr:`Enumeration.scope`)."""
    out.scope = configs.scope
    if out.scope and out.status in (Status.OPTIMAL, Status.INFEASIBLE):
        out.notes.append(f"{out.status.value} under {out.scope}: admission orders of larger replicas were not "
                         f"searched (exact up to {configs.exact_sessions} sessions per replica)")
    return out


def _solve_batched_search(problem, perf, obj, search, stats, allowed, mode, t0) -> SolveOutcome:
    """Objectives with a threshold search (cost, makespan) over the configuration columns."""
    res = search.run(obj.search, None)
    stats.solves += res.lp_solves + res.milp_solves
    stats.time_s = time.perf_counter() - t0
    if res.counts is None:
        status = Status.INFEASIBLE if res.bound is None else Status.TIME_LIMIT
        stats.status = status
        return SolveOutcome(status, obj, None, None, None, stats, allowed, mode)
    plan = plan_from_batch_configurations(problem, perf, res.counts)
    ev = evaluate(problem, plan, perf)
    value = obj.value(ev)
    bnd = _search_bound_in_unit(problem, obj, res.bound) if res.bound is not None else None
    if res.proven:
        bnd = min(value, bnd)
    return finish(Status.OPTIMAL if res.proven else Status.FEASIBLE, obj, value, bnd, ev, stats, allowed, mode)


def _solve_batched_additive(problem, perf, obj, search, need, deadline, stats, allowed, mode, t0) -> SolveOutcome:
    """Objectives additive over instances (``column_cost``): a count (MILP, then the smallest
    makespan among its optima) or a ratio (Dinkelbach on MILPs)."""
    from optimizer.deployment.batching import solve_count, solve_ratio

    if obj.kind == "ratio":
        st, counts, lam = solve_ratio(search, obj, need, deadline)
        bound = obj.ratio_in_unit(problem, lam) if lam is not None else None
    else:
        st, counts, raw = solve_count(search, obj, need, deadline)
        bound = obj.bound_in_unit(problem, math.ceil(raw - 1e-6)) if raw is not None else None
    stats.solves += search.lp_solves + search.milp_solves
    stats.time_s = time.perf_counter() - t0
    if counts is None:
        status = Status.INFEASIBLE if st == "infeasible" else Status.TIME_LIMIT
        stats.status = status
        return SolveOutcome(status, obj, None, None, None, stats, allowed, mode)
    ev = evaluate(problem, plan_from_batch_configurations(problem, perf, counts), perf)
    value = obj.value(ev)
    proven = st == "optimal"
    if proven and bound is not None:
        bound = min(bound, value)  # the search's exact optimum in ticks; the evaluator's value to rounding
    return finish(Status.OPTIMAL if proven else Status.FEASIBLE, obj, value, bound, ev, stats, allowed, mode)


def plan_from_batch_configurations(problem: Problem, perf: PerfModel, counts) -> Plan:
    """Instances from (layout, batch limit, sessions) configuration counts: sessions per class
    taken in id order, admitted in the configuration's order (its searched ``order``, else the
    rule's, :func:`optimizer.deployment.batching.admission_order`), packed on servers first-fit."""
    import numpy as np

    from optimizer.deployment.batching import admission_order
    from optimizer.deployment.units import ticks_up

    pools = {c.index: list(c.session_ids) for c in problem.classes}
    items = []
    for cfg, r in sorted(counts, key=lambda t: -t[0].degree):
        single = [ticks_up(perf.steps.single_session_step_s(cfg.layout, np.arange(c.context, c.context + c.new)).sum())
                  for c in problem.classes]
        for _ in range(r):
            if cfg.order is not None:  # an exactly searched order: class per admission position
                items.append((cfg.degree, [pools[i].pop(0) for i in cfg.order], cfg.layout, cfg.batch))
                continue
            sess, jobs, ticks = [], [], []
            for c in problem.classes:
                for _ in range(cfg.counts[c.index]):
                    sess.append(pools[c.index].pop(0))
                    jobs.append((c.context, c.new, c.deadline_s))
                    ticks.append(single[c.index])
            order = admission_order(jobs, ticks, cfg.batch)
            items.append((cfg.degree, [sess[i] for i in order], cfg.layout, cfg.batch))
    return pack_on_servers(problem, items)


def plan_from_configurations(problem: Problem, options, counts) -> Plan:
    """Instances from configuration counts: sessions per class taken in id order, run in
    Moore-Hodgson order (on-time ones by deadline, late ones after); instances packed on
    servers first-fit, spanning instances on whole servers first."""
    pools = {c.index: list(c.session_ids) for c in problem.classes}
    dl = deadline_ticks(problem.classes)
    items = []
    for cfg, r in sorted(counts, key=lambda t: -t[0].degree):
        for _ in range(r):
            sess, jobs = [], []
            for c in problem.classes:
                for _ in range(cfg.counts[c.index]):
                    sess.append(pools[c.index].pop(0))
                    jobs.append((options[cfg.degree].ticks[c.index], dl[c.index]))
            on, late = moore_hodgson_order(jobs)
            late.sort(key=lambda i: (jobs[i][1] is None, jobs[i][1] or 0))
            items.append((cfg.degree, [sess[i] for i in on + late]))
    return pack_on_servers(problem, items)


def _search_bound_in_unit(problem: Problem, objective: DeploymentObjective, bound: Fraction) -> float:
    """A column search's bound (a ratio in GPU·ticks per session for ``cost`` searches,
    ticks of makespan otherwise) in the objective's unit."""
    if objective.search == "cost":
        return objective.ratio_in_unit(problem, bound)
    return objective.bound_in_unit(problem, float(bound))


def _workers(f) -> int:
    """CP-SAT's portfolio (LNS among it) pays off on larger models even on 2 cores."""
    return 8 if len(f.model.proto.variables) > 400 else 2


def _nominal_seed_plan(problem: Problem, perf: PerfModel, usable, objective: DeploymentObjective, budget_s: float):
    """A good plan of the problem without faults (configuration search), to warm-start the
    sequence formulation; None when none is found quickly."""
    from dataclasses import replace

    nominal = replace(problem, faults=())
    obj = objective if objective.search else MAKESPAN
    stats = SolverStats("seed", Status.INFEASIBLE, 0.0, solves=0)
    done = _solve_with_configurations(nominal, PerfModel(nominal), usable, obj,
                                      time.perf_counter() + max(0.1, budget_s), stats, tuple(usable))
    return None if done is None or done.evaluation is None else done.evaluation.plan


def hint_from_plan(f: Formulation, plan: Plan, spt: bool = False) -> None:
    """Hint the sequence formulation with ``plan`` (instances mapped onto matching slots,
    heavier first so the load-order symmetry breaking agrees; ``spt``: shortest session
    first within an instance)."""
    by_id = {s.id: s for s in f.problem.sessions}
    free: dict[tuple, list] = {}
    for k in f.slots:
        free.setdefault((k.degree, k.servers), []).append(k)
    svc = lambda p, sid: f.options[p].ticks[by_id[sid].cls]
    chosen: dict[int, list[str]] = {}
    for inst in sorted(plan.instances, key=lambda i: -sum(svc(i.degree, s) for s in i.sessions)):
        slots = free.get((inst.degree, tuple(inst.servers)))
        if not slots:
            return  # the plan does not map onto these slots: no hint
        k = slots.pop(0)
        order = sorted(inst.sessions, key=lambda sid: svc(inst.degree, sid)) if spt else list(inst.sessions)
        if len(order) > f.Q[k.index]:
            return
        chosen[k.index] = order
    m = f.model
    for k in f.slots:
        order = chosen.get(k.index, [])[::-1]  # positions count from the end of the run
        for q in range(f.Q[k.index]):
            cls = by_id[order[q]].cls if q < len(order) else None
            for c in f.classes:
                z = f.z.get((k.index, q, c.index))
                if z is not None:
                    m.add_hint(z, 1 if c.index == cls else 0)


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
            for r in reversed(range(f.Q[k.index])):  # positions count from the end of the run
                for c in f.classes:
                    z = f.z.get((k.index, r, c.index))
                    if z is not None and solver.boolean_value(z):
                        order.append(pools[c.index].pop(0))
        chosen.append((k, order))
    return Plan(_assign_gpus(f, solver, chosen))


def _assign_gpus(f: Formulation, solver, chosen) -> list[PlannedInstance]:
    G = f.problem.server.gpus
    if f.pooled:
        chosen = _place_pooled(f, solver, chosen)
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


def _place_pooled(f: Formulation, solver, chosen):
    """Give pooled slots their servers from the per-server counts ``n[p][s]`` / ``span[p][s]``."""
    from dataclasses import replace

    G = f.problem.server.gpus
    out = []
    for p in sorted({k.degree for k, _ in chosen}, reverse=True):
        mine = [(k, o) for k, o in chosen if k.degree == p]
        if p <= G:
            seats = [s for s in range(f.problem.servers) for _ in range(solver.value(f.server_count[p, s]))]
            groups = [(s,) for s in seats]
        else:
            m = p // G
            spans = [s for s in range(f.problem.servers) if solver.boolean_value(f.server_span[p, s])]
            groups = [tuple(spans[i:i + m]) for i in range(0, len(spans), m)]
        if len(groups) != len(mine):
            raise RuntimeError(f"server counts for TP{p} do not match the used slots")
        out += [(replace(k, servers=grp), o) for (k, o), grp in zip(mine, groups)]
    return out


def max_on_time(problem: Problem, perf: PerfModel, degrees, time_limit_s: float, undecided=None):
    """Most sessions that can finish on time (worst fault scenario) with these degrees,
    ignoring the on-time requirement; None if the sessions cannot all be placed; ``undecided``
    (default None) when the solve ends by its time limit without an answer."""
    usable = usable_degrees(problem, perf, degrees)
    if not usable:
        return None
    if any(all(perf.max_sessions(p, c.context, c.new) == 0 for p in usable) for c in problem.classes):
        return None  # a session fits no instance of these degrees
    if problem.faults and _columns_apply(problem, usable):
        cols = enumerate_columns(problem, build_options(problem, perf, usable),
                                 deadline=time.perf_counter() + time_limit_s)
        if cols:
            res = solve_columns(problem, cols, "worst_on_time", 0, time.perf_counter() + time_limit_s)
            if res is not None:
                return int(res.value)
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
    if out.status == Status.TIME_LIMIT:
        return undecided
    if out.status not in (Status.OPTIMAL, Status.FEASIBLE):
        return None
    return int(out.solver.value(t))


def conflicts(problem: Problem, perf: PerfModel, objective, time_limit_s: float = 10.0):
    """Named constraints that cannot hold together (a minimal set when time allows).

    Without faults the aggregate model explains it whatever the objective (whether a plan
    exists does not depend on it); with faults, the objective's own formulation.

    Returns:
        (keys, formulation) — keys is empty when the model could not be explained in time.
    """
    usable = usable_degrees(problem, perf, problem.degrees)
    if not usable:
        return [], None
    if problem.faults:
        f = build(problem, perf, usable, objective, explain=True)
    else:  # feasibility does not depend on the objective: the aggregate model explains it for all
        f = Formulation(problem, perf, usable, "aggregate", explain=True)
        f.required = max(f.required, get_objective(objective).min_on_time)
        f.build()
    keys = f.nm.minimal_conflict(time_limit_s)
    return (keys or []), f
