"""Explanations: binding limits with their slack, why each TP degree alone loses, and the
named constraints that conflict when no plan exists."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from optimizer.model.collectives import AllReduceSource
from optimizer.deployment.evaluate import Evaluation
from optimizer.deployment.params import degree_fits_hardware, degree_fits_model
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
