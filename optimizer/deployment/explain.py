"""Explanations: binding limits with their slack, why each TP degree alone loses, and the
named constraints that conflict when no plan exists."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from optimizer.deployment.collectives import AllReduceSource
from optimizer.deployment.evaluate import Evaluation
from optimizer.deployment.formulation import degree_fits_hardware, degree_fits_model
from optimizer.deployment.units import TIME_UNIT_S
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import Problem
from optimizer.result import Binding, ConstraintKey, Status, relative_gap



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
    reason, detail = _versus_chosen(out.value, best_value, shape)
    return Alternative(name, gpus, reason, detail, out.value, out.status, len(ev.plan.instances),
                       w.on_time, w.makespan_s * 1e3, outcome=out, shape=shape)


def _versus_chosen(value: float, best_value: Optional[float], shape: str) -> tuple[str, str]:
    """(reason, detail) of a plan row against the chosen plan's value: a tie, or by how much it
    differs (``+x.x% vs chosen``)."""
    if best_value is not None and abs(value - best_value) <= 1e-9 * max(1.0, abs(best_value)):
        return "tie", f"as good as the chosen plan: {shape}"
    pct = f"{(value / best_value - 1) * 100:+.1f}% vs chosen: " if best_value else ""
    return "objective", pct + shape


def adopt_better_row(problem: Problem, objective, outcome, rows: list[Alternative]):
    """The main outcome, or the best comparison row's plan when that is better (or the main
    solve has none): a row restricted to one option can find, in its own time, a plan the
    main search missed (a fresh user's 40 sessions with faults: the chosen plan 1.571, the TP4
    row 1.545; with the makespan objective the main solve had no plan while two rows had
    one). The adopted plan keeps the main solve's bound (valid for every option) and is
    optimal only when that bound meets it; the rows' "vs chosen" texts are rewritten."""
    import math
    from dataclasses import replace

    from objectives.deployment import get

    sign = -1.0 if get(objective).sense == "max" else 1.0
    ok = [a for a in rows if a.outcome is not None and a.value is not None and math.isfinite(a.value)
          and a.outcome.evaluation is not None and not a.outcome.evaluation.violations]
    if not ok:
        return outcome
    best = min(ok, key=lambda a: sign * a.value)
    if outcome.value is not None and outcome.evaluation is not None and \
            sign * best.value >= sign * outcome.value - 1e-9 * max(1.0, abs(outcome.value)):
        return outcome
    bound = outcome.bound
    status = Status.OPTIMAL if bound is not None and sign * bound >= sign * best.value * (1 - 1e-9) else Status.FEASIBLE
    got = best.outcome
    stats = replace(got.stats, status=status, objective=best.value, bound=bound,
                    gap=0.0 if status == Status.OPTIMAL else relative_gap(best.value, bound),
                    name=f"{got.stats.name} (comparison row {best.option})")
    adopted = replace(got, status=status, bound=bound, degrees=outcome.degrees, stats=stats,
                      notes=[f"plan from the comparison row {best.option}: better than the main search's "
                             + (f"({best.value:.6g} against {outcome.value:.6g})" if outcome.value is not None else
                                "(which found none)") + ("; bound from the main search" if bound is not None else
                                                         "; the main search reached no bound")]
                      + [f"comparison row {best.option}: {n}" for n in got.notes])
    for a in ok:  # the texts compared each row with the old chosen plan
        a.reason, a.detail = _versus_chosen(a.value, best.value, a.shape)
    return adopted


def alternatives(problem: Problem, perf: PerfModel, objective, best_value: Optional[float],
                 time_budget_s: float, incumbent=None) -> list[Alternative]:
    """One row per allowed TP degree: its best single-degree plan or the reason it has none.

    ``incumbent`` (the main solve's outcome) is reused: a degree its plan uses alone gets the
    plan's row without a solve. The rows share ``time_budget_s``; a row whose solve the budget
    cuts short says ``time_limit``.
    """
    from objectives.deployment import get
    from optimizer.deployment.solver import max_on_time, solve_deployment

    if not problem.tp_only:
        return layout_alternatives(problem, perf, objective, best_value, time_budget_s, incumbent)
    rows: list[Alternative] = []
    degrees = list(problem.degrees)
    t_end = time.perf_counter() + time_budget_s
    for i, p in enumerate(degrees):
        name = f"tp{p}"
        hw = degree_fits_hardware(problem, p)
        if hw:
            rows.append(Alternative(name, p, "gpus", hw, static=True))
            continue
        heads = degree_fits_model(problem, p)
        if heads:
            rows.append(Alternative(name, p, "heads", heads, static=True))
            continue
        mem = memory_rejection(problem, perf, p)
        if mem:
            c = min(problem.classes, key=lambda c: c.context + c.new)
            rows.append(Alternative(name, p, "memory", mem, static=True,
                                    need_bytes=perf.memory_per_gpu(p, [(c.context, c.new)])))
            continue
        share = max(0.2, (t_end - time.perf_counter()) / max(1, len(degrees) - i))
        ev0 = getattr(incumbent, "evaluation", None)
        if ev0 is not None and ev0.plan.instances and all(inst.degree == p for inst in ev0.plan.instances) \
                and incumbent.status == Status.OPTIMAL:
            out = incumbent  # the optimal plan uses this degree alone: it is this row's optimum too
        elif time.perf_counter() >= t_end:
            rows.append(Alternative(name, p, "time_limit", "not solved: the time limit was used up", status=Status.TIME_LIMIT))
            continue
        else:
            out = solve_deployment(problem, objective, share, degrees=[p], perf=perf)
        if out.status in (Status.OPTIMAL, Status.FEASIBLE):
            rows.append(plan_row(problem, objective, name, p, out, best_value, ""))
            continue
        if out.status == Status.TIME_LIMIT:
            rows.append(Alternative(name, p, "time_limit", "no plan found within the time limit", status=out.status))
            continue
        lp_note = next((n for n in out.notes if n.startswith("the LP relaxation proves")), None)
        if lp_note is not None:  # proven by the anytime solve's LP: no compact model to build
            rows.append(Alternative(name, p, "memory" if "cannot all be placed" in lp_note else "deadline", lp_note))
            continue
        best_on = max_on_time(problem, perf, [p], max(0.2, (t_end - time.perf_counter()) / max(1, len(degrees) - i)),
                              undecided=-1)
        n = len(problem.sessions)
        if best_on == -1:  # infeasible, but the most on time was not found in time
            rows.append(Alternative(name, p, "time_limit", "infeasible; the most sessions on time was not found within "
                                    "the time limit", status=Status.TIME_LIMIT))
            continue
        if best_on is None:
            too_big = [c for c in problem.classes if perf.max_sessions(p, c.context, c.new) == 0]
            if too_big:  # some session fits no TP-p instance even alone: say which, and by how much
                c = max(too_big, key=lambda c: c.context + c.new)
                need = perf.memory_per_gpu(p, [(c.context, c.new)])
                detail = (f"{c.session_ids[0]} ({c.context + c.new} tokens) needs {need / 1e9:.2f} GB per GPU "
                          f"> {problem.gpu.memory_bytes / 1e9:g} GB")
            else:
                cap = max(perf.max_sessions(p, c.context, c.new) for c in problem.classes)
                slots = problem.total_gpus // p
                detail = f"{n} sessions do not fit {slots} TP{p} instances (at most {cap} per instance)"
            rows.append(Alternative(name, p, "memory", detail))
        else:
            need = max(problem.required_on_time, get(objective).min_on_time)
            where = " in the worst fault scenario" if problem.faults else ""
            rows.append(Alternative(name, p, "deadline", f"{best_on} of {n} on time{where} < {need} required", on_time=best_on))
    for row in rows:
        row.allreduce = perf.allreduce_source(row.degree)
    return rows


def layout_alternatives(problem: Problem, perf: PerfModel, objective, best_value: Optional[float],
                        time_budget_s: float, incumbent=None) -> list[Alternative]:
    """One row per allowed layout (layouts / batched problems): the best plan using that layout
    alone (batch limits chosen as in the main search), or why it has none."""
    from objectives.deployment import get
    from optimizer.deployment.batching import layout_reason
    from optimizer.deployment.solver import solve_deployment

    rows: list[Alternative] = []
    lays = list(problem.layouts)
    t_end = time.perf_counter() + time_budget_s
    m = perf.model
    for i, lay in enumerate(lays):
        name = lay.label()
        bad = layout_reason(problem, lay)
        if bad:
            rows.append(Alternative(name, lay.gpus, bad[0], bad[1], static=True))
            continue
        if all(m.max_sessions(lay, c.context, c.new) == 0 for c in problem.classes):
            c = min(problem.classes, key=lambda c: c.context + c.new)
            need = m.memory_per_gpu(lay, [(c.context, c.new)])
            rows.append(Alternative(name, lay.gpus, "memory", f"needs {need / 1e9:.2f} GB per GPU > "
                                    f"{problem.gpu.memory_bytes / 1e9:g} GB", static=True, need_bytes=need))
            continue
        ev0 = getattr(incumbent, "evaluation", None)
        if ev0 is not None and ev0.plan.instances and all(inst.lay == lay for inst in ev0.plan.instances) \
                and incumbent.status == Status.OPTIMAL:
            out = incumbent
        elif time.perf_counter() >= t_end:
            rows.append(Alternative(name, lay.gpus, "time_limit", "not solved: the time limit was used up",
                                    status=Status.TIME_LIMIT))
            continue
        else:
            share = max(0.2, (t_end - time.perf_counter()) / max(1, len(lays) - i))
            out = solve_deployment(problem, objective, share, perf=perf, layouts=[lay])
        if out.status in (Status.OPTIMAL, Status.FEASIBLE):
            batches = sorted({inst.max_batch for inst in out.evaluation.plan.instances})
            rows.append(plan_row(problem, objective, name, lay.gpus, out, best_value,
                                 f"batch limit {'/'.join(map(str, batches))}, "))
        elif out.status == Status.TIME_LIMIT:
            rows.append(Alternative(name, lay.gpus, "time_limit", "no plan found within the time limit", status=out.status))
        else:
            n = len(problem.sessions)
            too_big = [c for c in problem.classes if m.max_sessions(lay, c.context, c.new) == 0]
            if too_big:
                c = max(too_big, key=lambda c: c.context + c.new)
                rows.append(Alternative(name, lay.gpus, "memory", f"{c.session_ids[0]} ({c.context + c.new} tokens) "
                                        f"does not fit a {name} instance"))
            else:
                need = max(problem.required_on_time, get(objective).min_on_time)
                rows.append(Alternative(name, lay.gpus, "deadline", f"no plan of {name} instances has {need} of {n} "
                                        f"sessions on time (or they do not fit the GPUs)"))
    for row in rows:
        lay = lays[rows.index(row)]
        if lay.attention_tp > 1 and lay.attention_tp <= problem.total_gpus:
            row.allreduce = perf.model.hw.allreduce_source(lay.attention_tp, perf.message_bytes)
    return rows


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
    slots = {k.label: k for k in f.slots} if f is not None else {}
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
        if key.family == "memory" and key.element in slots:
            k = slots[key.element]
            opt = f.options[k.degree]
            caps = ", ".join(f"{opt.cap[c.index]} of {c.session_ids[0].split('/')[0]}" for c in problem.classes)
            out.append(f"{key}: a TP{k.degree} instance has {opt.room_bytes / 1e9:.2f} GB per GPU for KV cache (holds at most {caps})")
        elif key.family == "assignment":
            out.append(f"{key}: every session must be served by one instance")
        elif key.family == "on_time":
            out.append(f"{key}: at least {f.required if f is not None else problem.required_on_time} of {len(problem.sessions)} sessions on time")
        elif key.family == "deadline" and f is not None and "classes" in f.key_info.get(key, {}):
            info = f.key_info[key]
            k = info["slot"]
            fastest = min(f.options[k.degree].service_s[c] for c in info["classes"])
            out.append(f"{key}: the sessions a TP{k.degree} instance runs on time up to "
                       f"{info['deadline_ticks'] * TIME_UNIT_S * 1e3:.6g} ms must fit in that time, one after "
                       f"another (at least {fastest * 1e3:.3f} ms each)")
        elif key.family == "deadline":
            out.append(f"{key}: a session counted on time finishes by its deadline")
        elif key.family == "gpus_per_server":
            out.append(f"{key}: at most {problem.server.gpus} GPUs in instances")
        else:
            out.append(str(key))
    return out
