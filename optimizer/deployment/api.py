"""Deployment problem API: load, solve (with explanations) and the CLI entry point; minimise
cost / makespan / latency / energy under memory, deadline, on-time and fault limits."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from optimizer.budget import Budget, work_seconds
from optimizer.deployment import strategy
from optimizer.deployment.context import SolveContext
from optimizer.deployment.exact import conflicts, max_on_time, servers_to_fit
from optimizer.deployment.explain import binding, conflict_details
from optimizer.deployment.outcome import resolve_objective
from optimizer.deployment.params import usable_degrees
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.progress import Progress
from optimizer.deployment.report import DeploymentReport
from optimizer.deployment.schema import Problem, build_problem
from optimizer.deployment.settings import SolverSettings
from optimizer.errors import warn_input
from optimizer.result import ConstraintKey, Status
from optimizer.schema_base import apply_overrides, read_yaml

DEFAULT_OBJECTIVE = "cost"
DEFAULT_TIME_LIMIT_S = SolverSettings().default_time_limit_s


def load(path, overrides=()) -> Problem:
    """Read, override (``dotted.key=value``) and validate a deployment instance file."""
    path = Path(path)
    raw = apply_overrides(read_yaml(path), list(overrides), path)
    return build_problem(raw, path)


def solve(problem: Problem, objective=DEFAULT_OBJECTIVE, time_limit_s: Optional[float] = None,
          explain: bool = True, budget: Optional[Budget] = None, progress=None,
          settings: Optional[SolverSettings] = None) -> DeploymentReport:
    """Solve and explain a deployment problem.

    Args:
        problem: from :func:`load`.
        objective: a name from ``objectives/deployment/`` (cost, dollars, gpus, makespan, latency,
            energy) or the objective object.
        time_limit_s: wall-clock budget of the whole call, explanations included (default:
            60 s for the main solve, then 1.5x its time, within 2-10 s, for explanations). With a
            limit T the budget is 92% of T less 0.4 s and 15 µs per session for the output, counted from ``budget.start`` (the CLI's
            start) when a budget is given; the main solve gets 60% of it (85% above 60 sessions) and the comparison rows and conflict
            explanation share the rest; parts cut short are listed in ``cut_short``.
        explain: also compute the per-degree comparison and binding constraints.
        budget: the command's budget (:class:`~optimizer.budget.Budget`); its limit replaces
            ``time_limit_s`` and its start counts the CLI's reading too.
        progress: a sink for ``--progress`` rows (see :data:`optimizer.budget.ProgressSink`).
        settings: shares and tuning constants of the strategy (default :class:`SolverSettings`).
    Returns:
        DeploymentReport (``status``, ``to_dict()``, ``render(console)``).
    Raises:
        InputError: unknown objective, or an input it needs is missing.
    """
    settings = settings or SolverSettings()
    t0 = time.perf_counter()
    if budget is not None:  # the CLI's reading and validation count against the limit too
        t0, time_limit_s = min(t0, budget.start), budget.limit_s
    obj = resolve_objective(problem, objective)
    perf = PerfModel(problem)
    cut: list = []
    if time_limit_s is None:
        main_s, whole = settings.default_time_limit_s, Budget(t0, None, None, cut)
    else:  # keep a margin for start-up, the binding limits and printing
        reserve = settings.output_s_per_session * len(problem.sessions)
        if budget is not None and budget.deadline is not None:  # the CLI's budget (its --plot reserve kept out)
            work = max(0.5 * time_limit_s, budget.deadline - budget.start - reserve)
        else:
            work = work_seconds(time_limit_s, reserve)
        share = settings.large_main_share if len(problem.sessions) > settings.large_sessions else settings.main_share
        main_s, whole = share * work, Budget(t0, time_limit_s, t0 + work, cut)
        late = time.perf_counter() - t0
        if late >= work:  # start-up and reading used the solve's whole share (e.g. --time-limit 0.001)
            main_s = 0.0
            if late >= time_limit_s:
                what = f"the limit of {time_limit_s:g} s (counted from the process start) had passed before the solve began"
            else:
                what = (f"the solve's share of the {time_limit_s:g} s limit ({work:.2f} s, counted from the process "
                        f"start) had been used before the solve began")
            warn_input("--time-limit", "", f"{what} ({late:.2f} s of start-up and reading): the solve ran its minimum "
                       f"steps only, the command may end after the limit, and the status says what they proved")
            cut.append("main solve (its time was used up before it began)")
    main = Budget(t0, main_s, time.perf_counter() + main_s, cut)
    ctx = SolveContext(problem, perf, obj, budget=whole, main=main,
                       progress=Progress(progress, obj.unit, t0 if budget is None else budget.start),
                       settings=settings, compare=explain, t0=t0)
    outcome = strategy.solve(ctx)
    report = DeploymentReport(problem, outcome, alternatives=ctx.rows, perf=perf, cut_short=cut)
    end = ctx.budget.deadline

    def left() -> float:
        return max(0.0, end - time.perf_counter()) if end is not None else 0.0

    if outcome.evaluation is not None and not outcome.evaluation.violations:
        report.binding = binding(problem, perf, outcome.evaluation, obj)
    if outcome.status == Status.INFEASIBLE:
        explain_infeasible(report, problem, perf, obj, left)
    report.total_time_s = time.perf_counter() - t0
    return report


def static_conflict(report: DeploymentReport, rows, what: str) -> bool:
    """When every option (TP degree or layout) is ruled out without a solve (GPUs, heads, one
    session's memory), those rules are the conflict; when one rule rules out all of them it is
    named, with the closest option for memory (the smallest need per GPU). True when it applied."""
    static = [a for a in rows if a.static]
    if not rows or len(static) != len(rows):
        return False
    report.conflict_keys = [ConstraintKey(a.reason, a.option) for a in static]
    report.conflict_details = [f"{a.reason}[{a.option}]: {a.detail}" for a in static]
    reasons = sorted({a.reason for a in static})
    if len(reasons) == 1:
        closest = static[0]
        if reasons[0] == "memory":
            closest = min(static, key=lambda a: a.need_bytes if a.need_bytes is not None else float("inf"))
        where = f" (closest: {closest.option})" if len(static) > 1 else ""
        report.achievable = {"requirement": reasons[0], "best": None, "required": None,
                             "detail": f"every {what} is ruled out by the {reasons[0]} rule{where}: {closest.detail}"}
    return True


def explain_infeasible(report: DeploymentReport, problem: Problem, perf: PerfModel, obj, left) -> None:
    """Fill the report's conflicts and the best achievable value of the violated requirement.

    Order: (1) when every TP degree is ruled out by limits that need no solve (GPUs, heads,
    memory), those rules are the conflict, grouped by rule; (2) otherwise a minimal conflicting
    set of named constraints from CP-SAT (or the anytime LP's proof), and the GPU count when
    more servers would make a plan exist (:func:`gpu_count_binds`); (3) the most sessions that
    can be on time (all degrees together) when the on-time requirement is what fails.
    """
    if not problem.tp_only:
        explain_infeasible_batched(report, problem, perf, obj, left)
        return
    rows = report.alternatives
    if static_conflict(report, rows, "TP degree"):
        return
    where = " in the worst fault scenario" if problem.faults else ""
    faulted = bool(problem.faults)  # more servers: checked without faults only (no claim with them)
    if problem.faults and any(n.startswith(NOMINAL_PROOF) for n in (report.outcome.notes or [])):
        from dataclasses import replace  # the nominal run already fails: explain it (fast, exact)

        problem, where = replace(problem, faults=()), " even without a fault"
    budget = left()
    if explain_by_lp(report, problem, obj):  # the compact model is too large to explain it
        if left() > 0.2 and not faulted:
            gpu_count_binds(report, problem, perf, obj, time.perf_counter() + 0.5 * left())
        return
    proof = next((n for n in (report.outcome.notes or []) if n.startswith("the aggregate CP-SAT model proves")), None)
    if proof is not None:  # the anytime path's feasibility check (large: no time for a minimal core)
        k = ConstraintKey("on_time", "nominal")
        report.conflict_keys = [k]
        report.conflict_details = [f"{k}: at least {max(problem.required_on_time, obj.min_on_time)} of "
                                   f"{len(problem.sessions)} sessions on time; {proof}"]
    elif budget > 0.2:
        keys, f = conflicts(problem, perf, obj, budget * 0.6)
        if keys:
            report.conflict_details = conflict_details(problem, perf, keys, f)
            report.conflict_keys = keys
    elif report.conflict_keys == []:
        report.cut_short.append("conflict explanation")
    if left() > 0.2 and not faulted:
        gpu_count_binds(report, problem, perf, obj, time.perf_counter() + 0.5 * left())
    need = max(problem.required_on_time, obj.min_on_time)
    usable = usable_degrees(problem, perf, problem.degrees)
    best = UNDECIDED
    if usable and left() > 0.1:
        best = max_on_time(problem, perf, usable, max(0.1, left()), undecided=UNDECIDED)
    n = len(problem.sessions)
    if best is UNDECIDED:  # not solved in time: no claim (it used to read as "do not fit in memory")
        if usable:
            report.cut_short.append("best achievable value")
    elif best is not None and best < need:
        report.achievable = {"requirement": "on_time", "best": best, "required": need,
                             "detail": f"at most {best} of {n} sessions can finish on time{where}; {need} required"}
    elif best is None and usable:
        report.achievable = {"requirement": "memory", "best": None, "required": n,
                             "detail": f"the {n} sessions do not all fit in GPU memory at once with TP "
                                       f"{', '.join(map(str, usable))}"}


def gpu_count_binds(report: DeploymentReport, problem: Problem, perf: PerfModel, obj, deadline: float) -> bool:
    """When more servers of the same kind would make the instance feasible, the GPU count is a
    binding limit: name it (``gpus_per_server[...]``, the family that limits the GPUs in
    instances) with the instances the GPUs hold and the fewest servers with which a plan meets
    every limit (:func:`~optimizer.deployment.exact.servers_to_fit`). True when it applied."""
    more = servers_to_fit(problem, obj, deadline)
    if more is None:
        return False
    G = problem.server.gpus
    usable = [p for p in usable_degrees(problem, perf, problem.degrees) if p <= G]
    hold = ", ".join(f"{(G // p) * problem.servers} TP{p}" for p in usable)
    why = (f"{problem.servers} server{'s' if problem.servers > 1 else ''} x {G} GPUs = {problem.total_gpus} GPUs"
           + (f" hold at most {hold} instances" if hold else "")
           + f"; with {more} servers ({more * G} GPUs) a plan meets every limit")
    keys = [k for k in report.conflict_keys if k.family == "gpus_per_server"]
    if keys:  # the minimal conflict names the family already: say what relaxing it does
        first = f"{keys[0]}: "
        report.conflict_details = [d + f" ({why})" if d.startswith(first) else d for d in report.conflict_details]
        if not any(d.startswith(first) for d in report.conflict_details):
            report.conflict_details.append(f"{keys[0]}: {why}")
    else:
        k = ConstraintKey("gpus_per_server", "all servers")
        report.conflict_keys = list(report.conflict_keys) + [k]
        report.conflict_details = list(report.conflict_details) + [f"{k}: {why}"]
    return True


UNDECIDED = object()  # max_on_time ran out of time
NOMINAL_PROOF = "no plan meets the on-time requirement even without a fault"  # the solver's note


def explain_by_lp(report: DeploymentReport, problem: Problem, obj) -> bool:
    """Infeasibility proven by the anytime solve's LP relaxation (see its note): the on-time
    requirement, or placing every session at all (memory, GPUs). False when not proven so."""
    note = next((n for n in (report.outcome.notes or []) if n.startswith("the LP relaxation proves")), None)
    if note is None:
        return False
    n, need = len(problem.sessions), max(problem.required_on_time, obj.min_on_time)
    if "cannot all be placed" in note:
        report.conflict_keys = [ConstraintKey("assignment", "all sessions"), ConstraintKey("memory", "all instances"),
                                ConstraintKey("gpus_per_server", "all servers")]
        report.conflict_details = ["assignment[all sessions]: every session must be served by one instance",
                                   f"memory[all instances]: {note}",
                                   "gpus_per_server[all servers]: instances fit the GPUs of the servers"]
        report.achievable = _kv_fit(problem, obj) or {"requirement": "memory", "best": None, "required": n,
                                                      "detail": note}
    else:
        report.conflict_keys = [ConstraintKey("on_time", "nominal")]
        report.conflict_details = [f"on_time[nominal]: at least {need} of {n} sessions on time; {note}"]
        report.achievable = {"requirement": "on_time", "best": None, "required": need, "detail": note}
    return True


def _kv_fit(problem: Problem, obj) -> Optional[dict]:
    """The most sessions whose KV memory a single layout on every GPU holds, smallest first
    (a placement, deadlines aside), and the servers the whole workload would need at that
    layout's KV room per server (a lower estimate); None when no layout holds one session."""
    import math

    import numpy as np

    from optimizer.deployment.anytime import Anytime
    from optimizer.deployment.anytime_solve import anytime_layouts

    perf = PerfModel(problem)
    A = Anytime(problem, perf, obj, anytime_layouts(problem, perf)[1])
    n, best = len(problem.sessions), None
    for k, kd in enumerate(A.kinds):
        count = problem.total_gpus // kd.gpus
        if not count:
            continue
        room = problem.gpu.memory_bytes - kd.static  # per stage
        kv = kd.kv[:, A.cls]  # [stage, session]
        # smallest first, in turn over the instances, until one fits nowhere (larger ones neither)
        got = A.place_in_turn({k: count}, order=np.argsort(kv.max(axis=0), kind="stable"), partial=True)
        placed = sum(len(ss) for _, ss in got or [])
        per_server = (problem.server.gpus // kd.gpus) * float(np.min(room)) if kd.gpus <= problem.server.gpus else 0.0
        total = float(kv.max(axis=0).sum())
        servers = math.ceil(total / per_server) if per_server > 0 else None
        if best is None or placed > best[0]:
            best = (placed, kd.layout.label(), servers)
    if best is None or best[0] == 0:
        return None
    placed, label, servers = best
    more = f"; all {n} need at least {servers} servers at {label}" if servers else ""
    return {"requirement": "memory", "best": placed, "required": n,
            "detail": f"{placed} of the {n} sessions' KV fits the GPUs ({label} on every GPU, smallest "
                      f"first, deadlines aside){more}"}


def explain_infeasible_batched(report: DeploymentReport, problem: Problem, perf: PerfModel, obj, left) -> None:
    """Infeasibility with layouts / batched decode: (1) every layout ruled out without a solve
    (GPUs, heads, memory) is the conflict; (2) otherwise the sessions that miss their deadline
    even alone on the fastest layout (a batched step is never faster than a single-session
    one), the on-time requirement and the most sessions on time over the whole search space."""
    import numpy as np

    from optimizer.deployment.batching import layout_options, max_on_time_batched

    rows = report.alternatives
    if static_conflict(report, rows, "layout"):
        return
    if explain_by_lp(report, problem, obj):
        return
    n = len(problem.sessions)
    need = max(problem.required_on_time, obj.min_on_time)
    best = max_on_time_batched(problem, perf, max(0.2, left())) if left() > 0.1 else None
    if best is None:
        report.achievable = {"requirement": "memory", "best": None, "required": n,
                             "detail": f"the {n} sessions do not all fit in GPU memory at once with the allowed layouts "
                                       f"(or the check ran out of time)"}
        report.conflict_keys = [ConstraintKey("assignment", "all sessions"), ConstraintKey("gpus_per_server", "all servers")]
        report.conflict_details = ["assignment[all sessions]: every session must be served by one instance",
                                   "gpus_per_server[all servers]: instances fit the GPUs of the servers"]
        return
    keys, details = [ConstraintKey("on_time", "nominal")], [f"on_time[nominal]: at least {need} of {n} sessions on time"]
    lays = list(layout_options(problem, perf, problem.layouts))
    for c in problem.classes:
        if c.deadline_s is None or not lays:
            continue
        alone = min(float(perf.model.single_session_step_s(lay, np.arange(c.context, c.context + c.new)).sum())
                    for lay in lays)
        if alone > c.deadline_s:
            k = ConstraintKey("deadline", c.session_ids[0])
            keys.append(k)
            details.append(f"{k}: even alone on the fastest layout a session needs {alone * 1e3:.3f} ms "
                           f"> deadline {c.deadline_s * 1e3:.6g} ms")
    report.conflict_keys, report.conflict_details = keys, details
    if best < need:
        report.achievable = {"requirement": "on_time", "best": best, "required": need,
                             "detail": f"at most {best} of {n} sessions can finish on time; {need} required"}


def run(raw: dict[str, Any], path: Path, objective: Optional[str], budget: Budget,
        output_dir: Optional[Path], progress=None) -> DeploymentReport:
    """CLI entry point (see :mod:`optimizer.problems`)."""
    problem = build_problem(raw, path)
    return solve(problem, objective or DEFAULT_OBJECTIVE, budget=budget, progress=progress)
