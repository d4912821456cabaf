"""Explanations: binding limits with their slack, why each TP degree alone loses, and the
named constraints that conflict when no plan exists."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from optimizer.model.collectives import AllReduceSource
from constraints.deployment import describe as describe_constraint
from optimizer.deployment.evaluate import Evaluation
from optimizer.deployment.exact import conflicts, max_on_time, servers_to_fit, usable_degrees
from optimizer.deployment.params import degree_fits_hardware, degree_fits_model, kv_gpus_needed
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import Problem
from optimizer.result import Binding, ConstraintKey, Status



@dataclass
class Alternative:
    """The best plan using only one TP degree, or why none exists.

    ``reason`` is ``objective`` (it exists but is worse, or ``tie``) or the limit that rules it
    out: ``gpus``, ``memory``, ``deadline``, ``time_limit``. ``allreduce`` says whether the
    degree's AllReduce time came from an nccl-tests log or the alpha-beta model, and why.
    """

    option: str
    degree: int
    reason: str
    detail: str
    value: Optional[float] = None
    status: Optional[Status] = None
    instances: int = 0
    on_time: Optional[int] = None
    makespan_ms: Optional[float] = None
    static: bool = False  # ruled out without a solve (GPUs, heads, one session's memory)
    need_bytes: Optional[float] = None  # memory rows: bytes per GPU one session alone needs
    allreduce: Optional[AllReduceSource] = None  # where this degree's AllReduce time comes from
    outcome: Any = field(default=None, repr=False, compare=False)  # the row's SolveOutcome (plan rows)
    shape: str = field(default="", repr=False, compare=False)  # plan rows: instances, makespan, on time

    def to_dict(self) -> dict:
        d = {"option": self.option, "reason": self.reason, "detail": self.detail}
        if self.value is not None:
            d["value"] = self.value
            d["instances"] = self.instances
            d["on_time"] = self.on_time
            d["makespan_ms"] = self.makespan_ms
        if self.status is not None:
            d["status"] = self.status.value
        if self.allreduce is not None:
            d["allreduce"] = self.allreduce.to_dict()
        return d




def memory_rejection(problem: Problem, perf: PerfModel, p: int) -> Optional[str]:
    """``needs X GB per GPU > Y GB`` when not even the smallest session fits a TP-p instance."""
    if any(perf.max_sessions(p, c.context, c.new) > 0 for c in problem.classes):
        return None
    c = min(problem.classes, key=lambda c: c.context + c.new)
    need = perf.memory_per_gpu(p, [(c.context, c.new)])
    return f"needs {need / 1e9:.2f} GB per GPU > {problem.gpu.memory_bytes / 1e9:g} GB"


def plan_row(problem: Problem, objective, name: str, gpus: int, out, best_value: Optional[float],
             extra: str) -> Alternative:
    """The comparison row of an option that has a plan: a tie with the chosen plan, or how much
    worse it is (``extra`` adds option-specific words before the makespan)."""
    from objectives.deployment import get

    ev = out.evaluation
    w = get(objective).worst(ev)
    shape = (f"{len(ev.plan.instances)} instance(s), {extra}makespan {w.makespan_s * 1e3:.2f} ms, "
             f"{w.on_time} of {len(problem.sessions)} on time")
    reason, detail = versus_chosen(out.value, best_value, shape)
    return Alternative(name, gpus, reason, detail, out.value, out.status, len(ev.plan.instances),
                       w.on_time, w.makespan_s * 1e3, outcome=out, shape=shape)


def versus_chosen(value: float, best_value: Optional[float], shape: str) -> tuple[str, str]:
    """(reason, detail) of a plan row against the chosen plan's value: a tie, or by how much it
    differs (``+x.x% vs chosen``)."""
    if best_value is not None and abs(value - best_value) <= 1e-9 * max(1.0, abs(best_value)):
        return "tie", f"as good as the chosen plan: {shape}"
    pct = f"{(value / best_value - 1) * 100:+.1f}% vs chosen: " if best_value else ""
    return "objective", pct + shape


def binding(problem: Problem, perf: PerfModel, ev: Evaluation, objective: str) -> list[Binding]:
    """Limits that bind (or nearly) at the plan, tightest first, with their slack."""
    out: list[Binding] = []
    G = problem.server.gpus
    used = {s: 0 for s in range(problem.servers)}
    for inst in ev.plan.instances:
        for g in inst.gpus:
            used[g // G] += 1
    for s, u in used.items():
        if G - u == 0 or u == 0:
            pass
        out.append(Binding(ConstraintKey("gpus_per_server", f"server {s}"), float(G - u), "GPUs",
                           f"{u} of {G} GPUs in instances" + (" (full)" if u == G else "")))
    cap = problem.gpu.memory_bytes
    smallest_of: dict = {}  # layout -> (class with the least KV per GPU, its bytes), computed once
    for inst in ev.plan.instances:
        mem = ev.memory_per_gpu[inst.id]
        head = cap - mem
        if inst.lay not in smallest_of:
            kvg = lambda c: perf.model.kv_bytes_per_gpu(inst.lay, c.context, c.new)  # noqa: E731
            small = min(problem.classes, key=kvg)
            smallest_of[inst.lay] = (small, kvg(small))
        small, smallest = smallest_of[inst.lay]
        fits_more = int(head // smallest) if smallest > 0 else 0
        like = f"{small.context + small.new}-token session"
        out.append(Binding(ConstraintKey("memory", inst.id), head / 1e9, "GB",
                           f"{inst.lay.label()}: {mem / 1e9:.2f} of {cap / 1e9:g} GB per GPU; "
                           + (f"no room for another {like}" if fits_more == 0
                              else f"room for {fits_more} more {like}{'s' if fits_more > 1 else ''}")))
    w = ev.worst_by(objective)
    by_inst: dict[str, list] = {}
    for t in w.sessions:
        if t.deadline_s is not None and t.on_time:
            by_inst.setdefault(t.instance, []).append(t)
    for inst in ev.plan.instances:
        timings = by_inst.get(inst.id, [])
        if not timings:
            continue
        t = min(timings, key=lambda t: t.deadline_s - t.finish_s)
        slack_ms = (t.deadline_s - t.finish_s) * 1e3
        scen = "" if w.label == "nominal" else f" ({w.label})"
        out.append(Binding(ConstraintKey("deadline", t.id), slack_ms, "ms",
                           f"finishes at {t.finish_s * 1e3:.2f} ms, deadline {t.deadline_s * 1e3:g} ms{scen}"))
    need = problem.required_on_time
    scen = [ev.nominal] + ev.scenarios
    tight = min(scen, key=lambda r: r.on_time)
    out.append(Binding(ConstraintKey("on_time", tight.label), float(tight.on_time - need), "sessions",
                       f"{tight.on_time} of {len(problem.sessions)} on time, {need} required"))
    last = max(w.sessions, key=lambda t: t.finish_s) if w.sessions else None
    if last is not None:
        out.append(Binding(ConstraintKey("makespan", last.instance), 0.0, "ms",
                           f"{last.instance} finishes last, at {last.finish_s * 1e3:.2f} ms ({last.id})"))
    return sorted(out, key=_tightness)


def _tightness(b: Binding) -> tuple:
    scale = {"GPUs": 8.0, "GB": 80.0, "ms": 100.0, "sessions": 4.0}.get(b.unit, 1.0)
    return (b.slack / scale, b.key.family)


def conflict_details(problem: Problem, perf: PerfModel, keys: list[ConstraintKey], f) -> list[str]:
    """One sentence per conflicting key."""
    out = []
    if f is not None:
        for c in problem.classes:
            if c.deadline_s is None:
                continue
            best_p = min(f.options, key=lambda p: f.options[p].service_s[c.index])
            t = f.options[best_p].service_s[c.index]
            if t > c.deadline_s:
                out.append(f"{c.session_ids[0].split('/')[0]}: even alone on TP{best_p} a session needs "
                           f"{t * 1e3:.3f} ms > deadline {c.deadline_s * 1e3:.6g} ms")
    for key in keys:
        if f is None:  # no formulation: the families' sentences that need none
            out.append({"assignment": f"{key}: every session must be served by one instance",
                        "on_time": f"{key}: at least {problem.required_on_time} of {len(problem.sessions)} sessions on time",
                        "gpus_per_server": f"{key}: at most {problem.server.gpus} GPUs in instances"}.get(key.family, str(key)))
        else:
            out.append(describe_constraint(key, f))
    return out


@dataclass
class Explanation:
    """Why the solution is what it is: the limits that bind at the plan, or (infeasible) the
    constraints that conflict and the best achievable value of the violated requirement.

    Attributes:
        outcome: the solution's outcome (read only); rows: its comparison rows (read only).
        binding: binding limits, tightest first (:func:`binding`).
        conflict_keys: a conflicting set of named constraints (family + element key).
        conflict_details: one sentence per conflicting constraint (or general ones).
        achievable: the best achievable value of the violated requirement, or None.
        cut_short: explanation parts the time limit cut short.
    """

    outcome: Any
    rows: list
    binding: list = field(default_factory=list)
    conflict_keys: list = field(default_factory=list)
    conflict_details: list = field(default_factory=list)
    achievable: Optional[dict] = None
    cut_short: list = field(default_factory=list)


def explain(problem: Problem, perf: PerfModel, obj, outcome, rows: list, left) -> Explanation:
    """The explanation of a frozen outcome: binding limits of a plan, conflicts of an
    infeasible instance (``left()``: seconds left for the what-if solves)."""
    ex = Explanation(outcome, list(rows))
    if outcome.evaluation is not None and not outcome.evaluation.violations:
        ex.binding = binding(problem, perf, outcome.evaluation, obj)
    if outcome.status == Status.INFEASIBLE:
        explain_infeasible(ex, problem, perf, obj, left)
    return ex


def static_conflict(ex: "Explanation", rows, what: str) -> bool:
    """When every option (TP degree or layout) is ruled out without a solve (GPUs, heads, one
    session's memory), those rules are the conflict; when one rule rules out all of them it is
    named, with the closest option for memory (the smallest need per GPU). True when it applied."""
    static = [a for a in rows if a.static]
    if not rows or len(static) != len(rows):
        return False
    ex.conflict_keys = [ConstraintKey(a.reason, a.option) for a in static]
    ex.conflict_details = [f"{a.reason}[{a.option}]: {a.detail}" for a in static]
    reasons = sorted({a.reason for a in static})
    if len(reasons) == 1:
        closest = static[0]
        if reasons[0] == "memory":
            closest = min(static, key=lambda a: a.need_bytes if a.need_bytes is not None else float("inf"))
        where = f" (closest: {closest.option})" if len(static) > 1 else ""
        ex.achievable = {"requirement": reasons[0], "best": None, "required": None,
                             "detail": f"every {what} is ruled out by the {reasons[0]} rule{where}: {closest.detail}"}
    return True


def explain_infeasible(ex: "Explanation", problem: Problem, perf: PerfModel, obj, left) -> None:
    """Fill the explanation's conflicts and the best achievable value of the violated requirement.

    Order: (1) when every TP degree is ruled out by limits that need no solve (GPUs, heads,
    memory), those rules are the conflict, grouped by rule; (2) otherwise a minimal conflicting
    set of named constraints from CP-SAT (or the anytime LP's proof), and the GPU count when
    more servers would make a plan exist (:func:`gpu_count_binds`); (3) the most sessions that
    can be on time (all degrees together) when the on-time requirement is what fails.
    """
    if not problem.tp_only:
        explain_infeasible_batched(ex, problem, perf, obj, left)
        return
    rows = ex.rows
    if static_conflict(ex, rows, "TP degree"):
        return
    where = " in the worst fault scenario" if problem.faults else ""
    faulted = bool(problem.faults)  # more servers: checked without faults only (no claim with them)
    if problem.faults and any(n.startswith(NOMINAL_PROOF) for n in (ex.outcome.notes or [])):
        from dataclasses import replace  # the nominal run already fails: explain it (fast, exact)

        problem, where = replace(problem, faults=()), " even without a fault"
    budget = left()
    if explain_by_lp(ex, problem, obj):  # the compact model is too large to explain it
        if left() > 0.2 and not faulted:
            gpu_count_binds(ex, problem, perf, obj, time.perf_counter() + 0.5 * left())
        return
    proof = next((n for n in (ex.outcome.notes or []) if n.startswith("the aggregate CP-SAT model proves")), None)
    if proof is not None:  # the anytime path's feasibility check (large: no time for a minimal core)
        k = ConstraintKey("on_time", "nominal")
        ex.conflict_keys = [k]
        ex.conflict_details = [f"{k}: at least {max(problem.required_on_time, obj.min_on_time)} of "
                                   f"{len(problem.sessions)} sessions on time; {proof}"]
    elif budget > 0.2:
        keys, f = conflicts(problem, perf, obj, budget * 0.6)
        if keys:
            ex.conflict_details = conflict_details(problem, perf, keys, f)
            ex.conflict_keys = keys
    elif ex.conflict_keys == []:
        ex.cut_short.append("conflict explanation")
    if left() > 0.2 and not faulted:
        gpu_count_binds(ex, problem, perf, obj, time.perf_counter() + 0.5 * left())
    need = max(problem.required_on_time, obj.min_on_time)
    usable = usable_degrees(problem, perf, problem.degrees)
    best = UNDECIDED
    if usable and left() > 0.1:
        best = max_on_time(problem, perf, usable, max(0.1, left()), undecided=UNDECIDED)
    n = len(problem.sessions)
    if best is UNDECIDED:  # not solved in time: no claim (it used to read as "do not fit in memory")
        if usable:
            ex.cut_short.append("best achievable value")
    elif best is not None and best < need:
        ex.achievable = {"requirement": "on_time", "best": best, "required": need,
                             "detail": f"at most {best} of {n} sessions can finish on time{where}; {need} required"}
    elif best is None and usable:
        ex.achievable = {"requirement": "memory", "best": None, "required": n,
                             "detail": f"the {n} sessions do not all fit in GPU memory at once with TP "
                                       f"{', '.join(map(str, usable))}"}


def gpu_count_binds(ex: "Explanation", problem: Problem, perf: PerfModel, obj, deadline: float) -> bool:
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
    keys = [k for k in ex.conflict_keys if k.family == "gpus_per_server"]
    if keys:  # the minimal conflict names the family already: say what relaxing it does
        first = f"{keys[0]}: "
        ex.conflict_details = [d + f" ({why})" if d.startswith(first) else d for d in ex.conflict_details]
        if not any(d.startswith(first) for d in ex.conflict_details):
            ex.conflict_details.append(f"{keys[0]}: {why}")
    else:
        k = ConstraintKey("gpus_per_server", "all servers")
        ex.conflict_keys = list(ex.conflict_keys) + [k]
        ex.conflict_details = list(ex.conflict_details) + [f"{k}: {why}"]
    return True


UNDECIDED = object()  # max_on_time ran out of time
NOMINAL_PROOF = "no plan meets the on-time requirement even without a fault"  # the solver's note


def explain_by_lp(ex: "Explanation", problem: Problem, obj) -> bool:
    """Infeasibility proven by the anytime solve's LP relaxation (see its note): the on-time
    requirement, or placing every session at all (memory, GPUs). False when not proven so."""
    note = next((n for n in (ex.outcome.notes or []) if n.startswith("the LP relaxation proves")), None)
    if note is None:
        return False
    n, need = len(problem.sessions), max(problem.required_on_time, obj.min_on_time)
    if "cannot all be placed" in note:
        ex.conflict_keys = [ConstraintKey("assignment", "all sessions"), ConstraintKey("memory", "all instances"),
                                ConstraintKey("gpus_per_server", "all servers")]
        ex.conflict_details = ["assignment[all sessions]: every session must be served by one instance",
                                   f"memory[all instances]: {note}",
                                   "gpus_per_server[all servers]: instances fit the GPUs of the servers"]
        ex.achievable = _kv_fit(problem, obj) or {"requirement": "memory", "best": None, "required": n,
                                                      "detail": note}
    else:
        ex.conflict_keys = [ConstraintKey("on_time", "nominal")]
        ex.conflict_details = [f"on_time[nominal]: at least {need} of {n} sessions on time; {note}"]
        ex.achievable = {"requirement": "on_time", "best": None, "required": need, "detail": note}
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


def explain_infeasible_batched(ex: "Explanation", problem: Problem, perf: PerfModel, obj, left) -> None:
    """Infeasibility with layouts / batched decode: (1) every layout ruled out without a solve
    (GPUs, heads, memory) is the conflict; (2) otherwise the sessions that miss their deadline
    even alone on the fastest layout (a batched step is never faster than a single-session
    one), the on-time requirement and the most sessions on time over the whole search space."""
    import numpy as np

    from optimizer.deployment.batching import layout_options, max_on_time_batched

    rows = ex.rows
    if static_conflict(ex, rows, "layout"):
        return
    if explain_by_lp(ex, problem, obj):
        return
    n = len(problem.sessions)
    need = max(problem.required_on_time, obj.min_on_time)
    gpus = kv_gpus_needed(problem, perf)
    if gpus is not None and gpus > problem.total_gpus:
        ex.achievable = {"requirement": "memory", "best": None, "required": n,
                         "detail": f"the {n} sessions' KV caches, each held for the whole run, need at least "
                                   f"{gpus:,.1f} GPUs of room next to the weights; {problem.total_gpus} GPUs given"}
        ex.conflict_keys = [ConstraintKey("memory", "all GPUs"), ConstraintKey("assignment", "all sessions")]
        ex.conflict_details = [f"memory[all GPUs]: {problem.total_gpus} GPUs hold the weights of every replica and "
                               f"the KV of every session",
                               "assignment[all sessions]: every session must be served by one instance"]
        return
    best = max_on_time_batched(problem, perf, max(0.2, left())) if left() > 0.1 else None
    if best is None:
        ex.achievable = {"requirement": "memory", "best": None, "required": n,
                             "detail": f"the {n} sessions do not all fit in GPU memory at once with the allowed layouts "
                                       f"(or the check ran out of time)"}
        ex.conflict_keys = [ConstraintKey("assignment", "all sessions"), ConstraintKey("gpus_per_server", "all servers")]
        ex.conflict_details = ["assignment[all sessions]: every session must be served by one instance",
                                   "gpus_per_server[all servers]: instances fit the GPUs of the servers"]
        return
    keys, details = [ConstraintKey("on_time", "nominal")], [f"on_time[nominal]: at least {need} of {n} sessions on time"]
    lays = list(layout_options(problem, perf, problem.layouts))
    for c in problem.classes:
        if c.deadline_s is None or not lays:
            continue
        alone = min(float(perf.steps.single_session_step_s(lay, np.arange(c.context, c.context + c.new)).sum())
                    for lay in lays)
        if alone > c.deadline_s:
            k = ConstraintKey("deadline", c.session_ids[0])
            keys.append(k)
            details.append(f"{k}: even alone on the fastest layout a session needs {alone * 1e3:.3f} ms "
                           f"> deadline {c.deadline_s * 1e3:.6g} ms")
    ex.conflict_keys, ex.conflict_details = keys, details
    if best < need:
        ex.achievable = {"requirement": "on_time", "best": best, "required": need,
                             "detail": f"at most {best} of {n} sessions can finish on time; {need} required"}
