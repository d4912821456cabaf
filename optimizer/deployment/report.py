"""Deployment report: the ``--format json`` object and the rich tables."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizer.deployment.explain import Alternative
from optimizer.deployment.launch import notes_for as launch_notes_for
from optimizer.deployment.launch import replica_launches
from optimizer.deployment.launch import write as write_launch
from optimizer.deployment.perf import PerfModel, model_summary
from optimizer.deployment.schema import Problem
from optimizer.model.steptimes import ANALYTIC
from optimizer.deployment.outcome import SolveOutcome
from optimizer.launch import DEFAULT_VERSION
from optimizer.result import Binding, ConstraintKey, Status, envelope, group_conflicts

MAX_SESSION_ROWS = 40
MAX_INSTANCE_ROWS = 64  # the text report lists this many instances (the JSON all)
MAX_BINDING_ROWS = 12
MAX_LAUNCH_ROWS = 8  # the text report shows the commands of this many instances (the JSON and --output all)


@dataclass
class DeploymentReport:
    problem: Problem
    outcome: SolveOutcome
    alternatives: list[Alternative] = field(default_factory=list)
    binding: list[Binding] = field(default_factory=list)
    conflict_keys: list[ConstraintKey] = field(default_factory=list)
    conflict_details: list[str] = field(default_factory=list)
    total_time_s: float = 0.0
    achievable: dict | None = None  # infeasible: the best achievable value of the violated requirement
    cut_short: list[str] = field(default_factory=list)  # explanation parts the time limit cut short
    perf: Any = None
    _launches: Any = field(default=None, repr=False)

    @property
    def status(self) -> Status:
        return self.outcome.status

    def _perf(self) -> PerfModel:
        if self.perf is None:
            self.perf = PerfModel(self.problem)
        return self.perf

    def timing(self) -> dict[str, Any]:
        """Which source timed the plan's decode steps and its measured error band: ``{source, why,
        engine, layouts: {label: source}, error_band, memory}``. ``error_band`` is the source's
        median absolute TPOT error over measured serving runs of the GPU and engine
        (``instances/hardware/fidelity.yaml``; a calibration file's own held-out error when one is
        named), the spread a finish time inherits from its decode steps; None: uncalibrated."""
        from optimizer.model.bands import band
        from optimizer.model.measured import systems

        p = self.problem
        steps = self._perf().steps
        cal = p.performance.calibration
        b = cal.band if cal is not None else band(systems().get(p.gpu_catalog or ""), p.performance.engine,
                                                  steps.name)
        ev = self.outcome.evaluation
        lays = sorted({inst.lay for inst in ev.plan.instances} if ev is not None else set(), key=lambda lay: lay.label())
        return {"source": steps.name, "why": steps.why, "engine": p.performance.engine if steps.name not in ANALYTIC else None,
                "calibrated": cal is not None, "layouts": {lay.label(): steps.source_of(lay) for lay in lays},
                "error_band": None if b is None else {"finish_time_error": b["tpot_median_abs_error"],
                                                      "rows": b.get("rows"), "from": b.get("from")},
                "memory": "eq. 6-1: weights + KV of the instance's sessions + reserve per GPU"}

    def _allreduce(self, lay) -> dict[str, Any]:
        perf = self._perf()
        if perf.steps.source_of(lay) == "measured":
            return {"source": "measured", "algorithm": "", "tier": "", "time_us": None, "log": None, "log_ranks": None,
                    "reason": "inside the measured step (the database's AllReduce kernels)"}
        return perf.model.hw.allreduce_source(lay.attention_tp, perf.message_bytes).to_dict()

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The result envelope (:func:`optimizer.result.envelope`) of this deployment."""
        o = self.outcome
        p = self.problem
        obj = o.objective
        plan = None
        extra: dict[str, Any] = {"model": {**model_summary(p), **({"dtypes": p.dtypes.as_dict()} if p.dtypes else {})},
                                 "timing": self.timing()}
        ev = o.evaluation
        if ev is not None:
            G = p.server.gpus
            instances = []
            launches = {r.instance: r for r in self.launches()}
            for inst in ev.plan.instances:
                lay = inst.lay
                instances.append({
                    "id": inst.id, "tp": lay.attention_tp, "layout": lay.as_dict(), "layout_label": lay.label(),
                    "max_batch": inst.max_batch, "server": inst.servers[0], "servers": list(inst.servers),
                    "gpus": list(inst.gpus), "gpu_count": inst.degree, "sessions": list(inst.sessions),
                    "memory_gb_per_gpu": round(ev.memory_per_gpu[inst.id] / 1e9, 4),
                    "allreduce": self._allreduce(lay),
                    **launches[inst.id].to_dict(),
                })
            sessions = [{
                "id": t.id, "instance": t.instance, "start_ms": t.start_s * 1e3, "finish_ms": t.finish_s * 1e3,
                "deadline_ms": t.deadline_s * 1e3 if t.deadline_s is not None else None, "on_time": t.on_time,
            } for t in ev.nominal.sessions]
            price = p.gpu.dollars_per_gpu_hour
            plan = {
                "instances": instances,
                "sessions": sessions,
                "makespan_ms": ev.nominal.makespan_s * 1e3,
                "gpus_billed": p.total_gpus,
                "gpus_in_instances": ev.nominal.gpus_used,
                "servers_in_use": ev.nominal.servers_used,
                "on_time": ev.nominal.on_time,
                "required_on_time": p.required_on_time,
                "servers": p.servers,
                "gpus_per_server": G,
                "dollars_per_gpu_hour": price,
                "dollars_per_hour": None if price is None else price * ev.nominal.gpus_used,
                "launch": {"versions": dict(DEFAULT_VERSION), "notes": launch_notes_for(p)},
            }
            if p.faults:
                plan["fault_scenarios"] = [{
                    "gpu": r.gpu, "fault": r.label.split(" ")[0], "makespan_ms": r.makespan_s * 1e3,
                    "on_time": r.on_time, "objective": obj.scenario_value(p, r),
                } for r in ev.scenarios]
                worst = obj.worst(ev)
                plan["worst_scenario"] = {"label": worst.label, "gpu": worst.gpu}
            if ev.violations:
                extra["evaluator_violations"] = ev.violations
        conflicts = []
        if o.status == Status.INFEASIBLE:
            conflicts = self.conflict_groups()
        return envelope(
            "deployment", p.name, o.status,
            {"name": obj.name, "value": o.value, "unit": obj.unit, "bound": o.bound, "gap": o.stats.gap,
             "definition": obj.definition, "sense": obj.sense},
            plan,
            {"name": o.stats.name, "status": o.stats.status.value, "objective": o.value, "time_s": round(self.total_time_s, 4),
             "solve_time_s": round(o.stats.time_s, 4), "gap": o.stats.gap, "bound": o.bound,
             "solves": o.stats.solves, "formulation": o.mode, "method": o.method or None,
             "bound_method": o.bound_method or None, "cut_short": self.cut_short,
             "scope": o.scope or None},
            binding=[b.to_dict() for b in self.binding],
            alternatives=[a.to_dict() for a in self.alternatives],
            conflicts=conflicts,
            definitions=definitions(obj),
            achievable=self.achievable,
            notes=o.notes or None,
            **extra,
        )

    def conflict_groups(self) -> list[dict[str, Any]]:
        """Conflicting constraints grouped by family (one entry per family, with a count)."""
        details = {}
        for k, line in zip(self.conflict_keys, self.conflict_lines_by_key()):
            details[k] = line
        groups = group_conflicts(self.conflict_keys, details)
        general = [d for d in self.conflict_details if not any(d.startswith(str(k)) for k in self.conflict_keys)]
        if general and groups:
            groups[0]["detail"] = "; ".join(general + ([groups[0]["detail"]] if groups[0]["detail"] else []))
        return groups

    def conflict_lines_by_key(self) -> list[str]:
        """The detail sentence of each conflict key (same order as :attr:`conflict_keys`)."""
        out = []
        for k in self.conflict_keys:
            line = next((d for d in self.conflict_details if d.startswith(str(k))), "")
            out.append(line[len(str(k)) + 2:] if line.startswith(f"{k}: ") else line)
        return out

    # ------------------------------------------------------------------ launch commands
    def launches(self) -> list:
        """Per plan instance its vLLM and SGLang commands (:func:`optimizer.deployment.launch.replica_launches`);
        empty without a plan."""
        ev = self.outcome.evaluation
        if ev is None or ev.violations:
            return []
        if self._launches is None:
            self._launches = replica_launches(self.problem, ev, self._perf())
        return self._launches

    def write(self, out: Path) -> list[Path]:
        """``--output DIR``: ``DIR/deploy/<engine>/<instance>-<layout>[-node<r>].sh`` and
        ``DIR/deploy/deployment.json`` (:func:`optimizer.deployment.launch.write`); nothing without a plan."""
        reps = self.launches()
        return write_launch(self.problem, reps, Path(out)) if reps else []

    def render_launch(self, console) -> None:
        from rich.markup import escape

        reps = self.launches()
        if not reps:
            return
        console.print(f"[bold]Launch commands[/bold] (vLLM {DEFAULT_VERSION['vllm']}, SGLang {DEFAULT_VERSION['sglang']}; "
                      "--output DIR writes them as scripts)")
        for n in launch_notes_for(self.problem):
            console.print(escape(f"  ({n})"), soft_wrap=True)
        for r in reps[:MAX_LAUNCH_ROWS]:
            for node in r.nodes:
                where = f"{r.instance} {r.layout}, server {node.server}" + (
                    f" node {node.node_rank}" if len(r.nodes) > 1 else "")
                for engine in node.launches:
                    console.print(escape(f"  [{where}] {node.command(engine)}"), soft_wrap=True)
            for note in r.notes:
                console.print(escape(f"  [{r.instance} {r.layout}] ({note})"), soft_wrap=True)
        if len(reps) > MAX_LAUNCH_ROWS:
            console.print(f"({len(reps) - MAX_LAUNCH_ROWS} more instances: use --format json or --output DIR)")

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
                      f"{p.required_on_time} must be on time"
                      + (f" (at least {o.objective.min_on_time} for the {o.objective.name} objective)"
                         if o.objective.min_on_time > p.required_on_time else ""))
        if p.dtypes is not None and p.dtypes.derived:  # a default read from a quantized checkpoint
            console.print(escape(p.dtypes.line()), soft_wrap=True)
        obj = o.objective
        scope = f" under {o.scope}" if o.scope else ""
        if o.status == Status.INFEASIBLE:
            console.print(f"[bold red]infeasible{escape(scope)}[/bold red]: no deployment"
                          f"{' in that space' if scope else ''} meets every limit.")
            if self.achievable:
                console.print(f"[bold]best achievable[/bold]: {escape(self.achievable['detail'])}")
            groups = self.conflict_groups()
            if groups:
                console.print("Conflicting constraints:")
                for g in groups:
                    head = g["constraints"][0] if g["count"] == 1 else f"{g['family']} x{g['count']} ({g['constraints'][0]}, ...)"
                    console.print(f"  - {escape(head)}: {escape(g['detail'] or 'cannot hold with the others')}")
        elif o.status == Status.TIME_LIMIT:
            console.print("[bold yellow]time limit[/bold yellow]: no plan found within the time limit")
        ev = o.evaluation
        if ev is not None:
            gap = "" if o.stats.gap is None else f", gap {o.stats.gap * 100:.3g}%"
            bound = ", no bound" if o.bound is None else f", bound {obj.fmt(o.bound)}"
            head = o.status.value + (scope if o.status == Status.OPTIMAL else "")
            console.print(f"[bold]{escape(head)}[/bold]: {obj.name} = [bold]{obj.fmt(o.value)}[/bold]{bound}{gap}")
            t = Table(title="Instances")
            for col in ("instance", "layout", "batch", "server", "GPUs", "sessions (in order)", "GB/GPU", "finish ms"):
                t.add_column(col)
            finish = {}
            for s in ev.nominal.sessions:
                finish[s.instance] = max(finish.get(s.instance, 0.0), s.finish_s)
            for inst in ev.plan.instances[:MAX_INSTANCE_ROWS]:
                srv = str(inst.servers[0]) if len(inst.servers) == 1 else f"{inst.servers[0]}-{inst.servers[-1]}"
                t.add_row(inst.id, inst.lay.label(), str(inst.max_batch), srv, _ranges(inst.gpus), ", ".join(inst.sessions),
                          f"{ev.memory_per_gpu[inst.id] / 1e9:.2f}", f"{finish.get(inst.id, 0) * 1e3:.2f}")
            console.print(t)
            if len(ev.plan.instances) > MAX_INSTANCE_ROWS:
                console.print(f"({len(ev.plan.instances) - MAX_INSTANCE_ROWS} more instances: use --format json)")
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
            price = p.gpu.dollars_per_gpu_hour
            rate = "" if price is None else f", ${price * ev.nominal.gpus_used:,.2f}/hour at ${price:g}/GPU-hour"
            console.print(f"makespan {ev.nominal.makespan_s * 1e3:.2f} ms, {ev.nominal.on_time} of {len(p.sessions)} on time, "
                          f"{ev.nominal.gpus_used} of {p.total_gpus} GPUs in instances{rate}")
            if p.faults:
                w = obj.worst(ev)
                console.print(f"faults: {len(ev.scenarios)} scenarios; worst is {w.label}: makespan {w.makespan_s * 1e3:.2f} ms, "
                              f"{w.on_time} on time, {obj.name} {obj.fmt(obj.scenario_value(p, w))}")
            self.render_launch(console)
        if self.alternatives:
            logs = [f"{tier} {link.table.path} ({link.table.ranks} ranks)"
                    for tier, link in (("scale_up", p.server.scale_up), ("scale_out", p.server.scale_out)) if link.table]
            t = Table(title="Each TP degree alone" if p.tp_only else "Each layout alone", caption=escape("AllReduce logs: " + ", ".join(logs)) if logs else None)
            for col in ("option", "result", "why not chosen", "AllReduce"):
                t.add_column(col)
            by_label = {lay.label().lower(): lay for lay in p.layouts}
            for a in self.alternatives:
                res = obj.fmt(a.value) if a.value is not None else "-"
                why = a.detail if a.reason in ("objective", "tie") else f"{a.reason}: {a.detail}"
                ar = a.allreduce.summary() if a.allreduce is not None else "-"
                lay = by_label.get(a.option.lower())
                if a.allreduce is not None and lay is not None and self._perf().steps.source_of(lay) == "measured":
                    ar = "in the measured step"
                t.add_row(a.option, res, escape(why), escape(ar))
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
        # provenance beside the solver lines (the answer leads the output)
        tm = self.timing()
        b = tm["error_band"]
        mixed = sorted(k for k, v in tm["layouts"].items() if v != tm["source"])
        console.print(escape(f"step times: {tm['why']}"
                             + (f" ({', '.join(mixed)} by the analytic roofline)" if mixed else "")
                             + (f"; error band: finish times ±{b['finish_time_error']:.0%} (this source's median TPOT "
                                f"error over {b['rows']} measured {p.performance.engine} runs on this GPU)" if b else
                                "; no error band (the calibration file states none)" if tm["calibrated"] else
                                "; uncalibrated (no measured runs of this GPU and engine)")))
        s = o.stats
        console.print(f"solver {s.name}: {s.status.value}, {s.solves} solve(s), {s.time_s:.3f} s solving, "
                      f"{self.total_time_s:.3f} s in all, formulation {o.mode}")
        if o.method and o.method == o.bound_method:
            console.print(f"plan and bound from: {escape(o.method)}")
        elif o.method or o.bound_method:
            console.print(f"plan from: {escape(o.method or 'none')}; bound from: {escape(o.bound_method or 'none')}")
        if self.cut_short:
            console.print(f"[yellow]cut short by the time limit: {', '.join(self.cut_short)}[/yellow]")
        for n in o.notes:
            console.print(f"[red]{escape(n)}[/red]")
        console.print(f"[dim]{obj.name} = {escape(obj.definition)}[/dim]")


def definitions(obj) -> dict[str, str]:
    """Definitions of every figure the deployment result reports (the envelope's ``definitions``)."""
    return {
        f"objective ({obj.name})": f"{obj.definition} [{obj.unit}]",
        "model.dtypes": "weight_dtype and kv_dtype the plan is sized and timed with, and where each came from: the "
                        "instance (model.weight_dtype / model.kv_dtype), else the checkpoint's quantization_config and "
                        "what performance.engine stores for it with its KV-cache option at auto "
                        "(instances/engines/kv_defaults.yaml)",
        "plan.instances[].tp": "attention tensor-parallel degree of the instance",
        "plan.instances[].layout": "attention {tp, dp}, experts {tp, ep}, pp; GPUs = pp x attention.tp x attention.dp",
        "plan.instances[].gpus": "global GPU ids the instance holds (gpu_count of them)",
        "plan.instances[].max_batch": "sessions the instance decodes at once; sessions start in list order when a slot is free",
        "plan.instances[].memory_gb_per_gpu": "weights + KV cache of its sessions + reserve per GPU, GB (1e9 B), eq. 6-1",
        "plan.instances[].launch": "the instance's vLLM and SGLang command (its first server's; docs/deployment.md \"Launch commands\")",
        "plan.instances[].launch_nodes": "one entry per server the instance spans: its CUDA_VISIBLE_DEVICES and commands",
        "plan.instances[].launch_notes": "engines without a command for the instance's layout, and why",
        "plan.launch.versions": "engine versions the launch commands are written for (instances/engines/)",
        "plan.launch.notes": "plan-wide launch caveats: engines or layouts without a command, and why",
        "plan.instances[].allreduce": "where the instance's AllReduce time comes from (nccl-tests log, alpha-beta model, or inside the measured step)",
        "timing": "the step-time source of the decode steps (performance.source), per layout, and its error band: the median absolute TPOT error of that source over measured runs of the GPU and engine",
        "plan.sessions[].start_ms": "time the session's first decode step starts, ms from t=0 (no fault)",
        "plan.sessions[].finish_ms": "time the session's last decode step ends, ms from t=0 (no fault)",
        "plan.sessions[].on_time": "finish_ms <= deadline_ms (inclusive)",
        "plan.makespan_ms": "time until the last session finishes, ms (no fault)",
        "plan.gpus_billed": "every GPU of every server (what the cost objective bills)",
        "plan.gpus_in_instances": "GPUs that hold an instance (what the gpus and dollars objectives count)",
        "plan.dollars_per_hour": "GPUs in instances x dollars_per_gpu_hour, $/hour while every instance runs",
        "plan.fault_scenarios": "one run per (fault, GPU it hits): the instance on that GPU stalls and restarts its running session",
        "solver.solve_time_s": "wall time of the main solver calls, seconds",
        "solver.method": "the solve method (optimizer/deployment/methods/) that produced the plan, its formulation or phase in brackets",
        "solver.bound_method": "the solve method (and algorithm) that proved the bound or the infeasibility; null: no bound",
        "alternatives[]": "the best plan using one TP degree (or one layout) alone, or the limit that rules it out",
    }


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
