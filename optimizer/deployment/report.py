"""Deployment report: the ``--format json`` object and the rich tables."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from optimizer.deployment.explain import UNITS, Alternative, fmt_value
from optimizer.deployment.perf import model_summary
from optimizer.deployment.schema import Problem
from optimizer.deployment.solve import SolveOutcome
from optimizer.result import Binding, ConstraintKey, Status

MAX_SESSION_ROWS = 40
MAX_BINDING_ROWS = 12


@dataclass
class DeploymentReport:
    problem: Problem
    outcome: SolveOutcome
    alternatives: list[Alternative] = field(default_factory=list)
    binding: list[Binding] = field(default_factory=list)
    conflict_keys: list[ConstraintKey] = field(default_factory=list)
    conflict_details: list[str] = field(default_factory=list)
    total_time_s: float = 0.0

    @property
    def status(self) -> Status:
        return self.outcome.status

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        o = self.outcome
        p = self.problem
        d: dict[str, Any] = {
            "problem": "deployment",
            "name": p.name,
            "status": o.status.value,
            "objective": {"name": o.objective, "value": o.value, "unit": UNITS[o.objective], "bound": o.bound},
        }
        d["model"] = model_summary(p)
        ev = o.evaluation
        if ev is not None:
            G = p.server.gpus
            instances = []
            for inst in ev.plan.instances:
                instances.append({
                    "id": inst.id, "tp": inst.degree, "server": inst.servers[0], "servers": list(inst.servers),
                    "gpus": list(inst.gpus), "sessions": list(inst.sessions),
                    "memory_gb_per_gpu": round(ev.memory_per_gpu[inst.id] / 1e9, 4),
                })
            sessions = [{
                "id": t.id, "instance": t.instance, "start_ms": t.start_s * 1e3, "finish_ms": t.finish_s * 1e3,
                "deadline_ms": t.deadline_s * 1e3 if t.deadline_s is not None else None, "on_time": t.on_time,
            } for t in ev.nominal.sessions]
            d["plan"] = {
                "instances": instances,
                "sessions": sessions,
                "makespan_ms": ev.nominal.makespan_s * 1e3,
                "gpus_billed": p.total_gpus,
                "gpus_in_instances": sum(i.degree for i in ev.plan.instances),
                "on_time": ev.nominal.on_time,
                "required_on_time": p.required_on_time,
                "servers": p.servers,
                "gpus_per_server": G,
            }
            if p.faults:
                d["fault_scenarios"] = [{
                    "gpu": r.gpu, "fault": r.label.split(" ")[0], "makespan_ms": r.makespan_s * 1e3, "on_time": r.on_time,
                    "objective": _scenario_objective(o.objective, r),
                } for r in ev.scenarios]
                worst = ev.worst_by(o.objective)
                d["worst_scenario"] = {"label": worst.label, "gpu": worst.gpu}
            if ev.violations:
                d["evaluator_violations"] = ev.violations
        d["binding"] = [b.to_dict() for b in self.binding]
        d["rejected"] = [a.to_dict() for a in self.alternatives if a.reason != "tie"]
        d["comparison"] = [a.to_dict() for a in self.alternatives]
        if o.status == Status.INFEASIBLE:
            d["conflicts"] = {
                "constraints": [str(k) for k in self.conflict_keys],
                "families": sorted({k.family for k in self.conflict_keys}),
                "details": self.conflict_details,
            }
        d["solver"] = {
            "name": o.stats.name, "status": o.stats.status.value, "time_s": round(o.stats.time_s, 4),
            "gap": o.stats.gap, "bound": o.bound, "solves": o.stats.solves, "formulation": o.mode,
            "total_time_s": round(self.total_time_s, 4),
        }
        if o.notes:
            d["notes"] = o.notes
        return d

    # ------------------------------------------------------------------ tables
    def render(self, console) -> None:
        from rich.markup import escape
        from rich.table import Table

        o, p = self.outcome, self.problem
        title = f"[bold]{p.name}[/bold]"
        console.print(title)
        console.print(f"model {p.model.name}: {p.model.layers} layers, H={p.model.hidden}, "
                      f"QH={p.model.q_heads}, KVH={p.model.kv_heads}; {p.servers} x {p.server.name} "
                      f"({p.server.gpus} x {p.gpu.name}); {len(p.sessions)} sessions, "
                      f"{p.required_on_time} must be on time")
        if o.status == Status.INFEASIBLE:
            console.print("[bold red]infeasible[/bold red]: no deployment meets every limit. Conflicting constraints:")
            for line in self.conflict_details or [str(k) for k in self.conflict_keys]:
                console.print(f"  - {escape(line)}")
        elif o.status == Status.TIME_LIMIT:
            console.print("[bold yellow]time limit[/bold yellow]: no plan found within the time limit")
        ev = o.evaluation
        if ev is not None:
            gap = "" if o.stats.gap is None else f", gap {o.stats.gap * 100:.3g}%"
            bound = "" if o.bound is None else f", bound {fmt_value(o.objective, o.bound)}"
            console.print(f"[bold]{o.status.value}[/bold]: {o.objective} = [bold]{fmt_value(o.objective, o.value)}[/bold]{bound}{gap}")
            t = Table(title="Instances")
            for col in ("instance", "TP", "server", "GPUs", "sessions (in order)", "GB/GPU", "finish ms"):
                t.add_column(col)
            finish = {}
            for s in ev.nominal.sessions:
                finish[s.instance] = max(finish.get(s.instance, 0.0), s.finish_s)
            for inst in ev.plan.instances:
                srv = str(inst.servers[0]) if len(inst.servers) == 1 else f"{inst.servers[0]}-{inst.servers[-1]}"
                t.add_row(inst.id, str(inst.degree), srv, _ranges(inst.gpus), ", ".join(inst.sessions),
                          f"{ev.memory_per_gpu[inst.id] / 1e9:.2f}", f"{finish.get(inst.id, 0) * 1e3:.2f}")
            console.print(t)
            st = Table(title="Schedule" + (" (no fault)" if p.faults else ""))
            for col in ("session", "instance", "start ms", "finish ms", "deadline ms", "on time"):
                st.add_column(col)
            rows = ev.nominal.sessions
            for s in rows[:MAX_SESSION_ROWS]:
                st.add_row(s.id, s.instance, f"{s.start_s * 1e3:.2f}", f"{s.finish_s * 1e3:.2f}",
                           "-" if s.deadline_s is None else f"{s.deadline_s * 1e3:g}", "yes" if s.on_time else "[red]no[/red]")
            console.print(st)
            if len(rows) > MAX_SESSION_ROWS:
                console.print(f"({len(rows) - MAX_SESSION_ROWS} more sessions: use --format json)")
            console.print(f"makespan {ev.nominal.makespan_s * 1e3:.2f} ms, {ev.nominal.on_time} of {len(p.sessions)} on time, "
                          f"{p.total_gpus} GPUs billed")
            if p.faults:
                w = ev.worst_by(o.objective)
                console.print(f"faults: {len(ev.scenarios)} scenarios; worst is {w.label}: makespan {w.makespan_s * 1e3:.2f} ms, "
                              f"{w.on_time} on time, {o.objective} {fmt_value(o.objective, _scenario_objective(o.objective, w))}")
        if self.alternatives:
            t = Table(title="Each TP degree alone")
            for col in ("option", "result", "why not chosen"):
                t.add_column(col)
            for a in self.alternatives:
                res = fmt_value(o.objective, a.value) if a.value is not None else "-"
                why = a.detail if a.reason in ("objective", "tie") else f"{a.reason}: {a.detail}"
                t.add_row(a.option, res, escape(why))
            console.print(t)
        if self.binding:
            t = Table(title="Binding constraints (tightest first)")
            for col in ("constraint", "slack", "detail"):
                t.add_column(col)
            for b in self.binding[:MAX_BINDING_ROWS]:
                t.add_row(escape(str(b.key)), f"{b.slack:.4g} {b.unit}", escape(b.detail))
            console.print(t)
            if len(self.binding) > MAX_BINDING_ROWS:
                console.print(f"({len(self.binding) - MAX_BINDING_ROWS} looser constraints: use --format json)")
        s = o.stats
        console.print(f"solver {s.name}: {s.status.value}, {s.solves} solve(s), {s.time_s:.3f} s solving, "
                      f"{self.total_time_s:.3f} s in all, formulation {o.mode}")
        for n in o.notes:
            console.print(f"[red]{escape(n)}[/red]")


def _scenario_objective(objective: str, r) -> float:
    return {"cost": r.cost_gpu_s, "makespan": r.makespan_s * 1e3, "energy": r.energy_kj,
            "latency": r.mean_finish_s * 1e3}[objective]


def _ranges(gpus) -> str:
    gs = sorted(gpus)
    out, start, prev = [], gs[0], gs[0]
    for g in gs[1:] + [None]:
        if g is not None and g == prev + 1:
            prev = g
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if g is not None:
            start = prev = g
    return ",".join(out)
