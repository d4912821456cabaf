"""The build-out report: the ``--format json`` object and the rich tables."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from optimizer.buildout.evaluate import Evaluation
from optimizer.buildout.explain import BuildoutExplanation, kw, num, rack_content
from optimizer.buildout.schema import Problem
from optimizer.buildout.solve import BuildoutSolution
from optimizer.result import print_no_plan, Binding, Conflict, Status, envelope, group_conflicts

DEFINITIONS = {
    "plan.servers": "servers installed per type (whole install units)",
    "plan.delivered": "buildout.workload: output tokens/s the plan delivers at the workload's SLO (each type's servers "
                      "x its best aggregated worker's tokens/s per GPU x GPUs), its TPOT error band, and per type",
    "plan.racks": "racks per layout (cooling, servers and switch chips per rack) and their count",
    "plan.power_kw": "IT power of servers, switch chips, second tier and fixed load, kW, within the budget",
    "binding[].slack": "how far the plan is from the limit, in its unit (0 = tight); negative for a server type that fits no rack",
    "solver.cp_sat_time_s": "wall time of the CP-SAT calls alone, seconds",
    "achievable": "for an infeasible target: the most GPUs any plan fits within the limits",
}


@dataclass
class BuildoutReport:
    """Result of one build-out run (``status``, ``to_dict()``, ``render(console)``), built once
    from the problem, its solution and the explanation.

    Attributes:
        problem: the resolved problem (its objective included).
        solution: the frozen solution.
        explanation: binding limits, conflict, what is achievable, parts cut short.
        outputs: files written for ``--output`` (none for the build-out).
    """

    problem: Problem
    solution: BuildoutSolution
    explanation: BuildoutExplanation = field(default_factory=BuildoutExplanation)
    outputs: list = field(default_factory=list)

    @property
    def status(self) -> Status:
        return self.solution.status

    @property
    def evaluation(self) -> Evaluation | None:
        return self.solution.evaluation

    @property
    def binding(self) -> tuple[Binding, ...]:
        return self.explanation.binding

    @property
    def conflict(self) -> Conflict | None:
        return self.explanation.conflict

    @property
    def achievable(self) -> dict | None:
        """Infeasible target: the most GPUs that fit the limits."""
        return self.explanation.achievable

    @property
    def cut_short(self) -> list[str]:
        """Parts the time limit cut short."""
        return list(self.explanation.cut_short)

    @property
    def total_time_s(self) -> float:
        """Wall time of the run's solve and explanation (model building, every CP-SAT stage,
        the independent check and the what-if solves), s."""
        return self.solution.wall_s + self.explanation.wall_s

    # ------------------------------------------------------------------ JSON
    def plan_dict(self) -> dict[str, Any] | None:
        res, p, ev = self.solution, self.problem, self.evaluation
        if res.plan is None or ev is None:
            return None
        servers = dict(res.plan.servers)
        layout = []
        for group in res.plan.racks:
            content, sw, rk, ru = rack_content(p, group.pattern)
            layout.append({"cooling": group.pattern.cooling, "count": group.count, "servers": content, "switch_chips": sw,
                           "power_kw": round(rk, 6), "rack_units": ru})
        fabric = None
        if p.fabric is not None:
            f = p.fabric
            groups = []
            for d, u, c in ((g.downlinks, g.uplinks, g.count) for g in res.plan.leaves):
                groups.append({"count": c, "downlinks": d, "uplinks": u,
                               "downlink_gb_s": d * f.port_bandwidth_gb_s,
                               "uplink_gb_s": u * f.port_bandwidth_gb_s,
                               "oversubscription": (d / u) if u else None,
                               "unused_ports": f.switch_radix - d - u})
            ratios = [g["oversubscription"] for g in groups if g["oversubscription"] is not None]
            fabric = {
                "tiers": 2 if ev.second_tier else 1,
                "gpu_links": ev.gpu_links,
                "leaf_spine_links": ev.uplinks,
                "leaves": groups,
                "oversubscription": max(ratios) if ratios else None,
                "max_oversubscription": float(f.max_oversubscription),
                "second_tier_power_kw": f.second_tier_power_kw if ev.second_tier else 0.0,
                "switch_power_kw": round((ev.leaves + ev.spine) * f.switch_power_kw, 6),
            }
        cost = None
        if all(t.cost is not None for t in p.types):
            cost = round(sum(p.type(n).cost * c for n, c in servers.items()), 2)
            if p.domains is not None:
                cost = round(cost + ev.domains * p.domains.cost, 2)
        domains = None
        if p.domains is not None:
            dm = p.domains
            domains = {"domains": ev.domains, "cards_per_domain": dm.cards, "switch_chips": ev.domains * dm.switch_chips,
                       "port_links": ev.domains * dm.port_links, "power_kw": round(ev.domains * dm.power_kw, 6),
                       "cost": round(ev.domains * dm.cost, 2), "source": dm.source}
        return {
            "servers": servers,
            "gpus": ev.gpus,
            "power_kw": ev.power_kw,
            "power_budget_kw": p.power_budget_kw,
            "racks": {"air": ev.racks["air"], "liquid": ev.racks["liquid"]},
            "switches": {"leaf": ev.leaves, "spine": ev.spine},
            "install_units": ev.install_units,
            "install_unit_servers": p.install_unit_servers,
            "second_tier": ev.second_tier,
            "cost": cost,
            "cost_unit": p.cost_unit if cost is not None else None,
            "rack_layout": layout,
            "fabric": fabric,
            **({"scale_up_domains": domains} if domains is not None else {}),
        }

    def delivered(self, plan: dict) -> dict[str, Any] | None:
        """``buildout.workload``: the plan's delivered output tokens/s and its band, and per server type
        the tokens/s of one server, per GPU, the worker that gives it and what timed it; None
        without a workload."""
        p = self.problem
        if not any(t.delivered is not None for t in p.types):
            return None
        per_type = {t.name: {"tokens_per_s_per_server": t.tokens_per_s_int,
                             "tokens_per_s_per_gpu": round(t.delivered.per_gpu, 1), "worker": t.delivered.worker,
                             "timed_by": t.delivered.why, "tpot_error_band": t.delivered.tpot_band}
                    for t in p.types if t.delivered is not None}
        total = sum(t.tokens_per_s_int * plan["servers"].get(t.name, 0) for t in p.types if t.delivered is not None)
        bands = [t.delivered.tpot_band for t in p.types if t.delivered is not None and plan["servers"].get(t.name, 0)]
        return {"tokens_per_s": total, "tpot_error_band": None if not bands or None in bands else max(bands),
                "types": per_type}

    def to_dict(self) -> dict[str, Any]:
        """The result envelope (:func:`optimizer.result.envelope`) of this build-out."""
        res, p = self.solution, self.problem
        obj = res.objective
        solver = res.stats.to_dict()
        # time_s: the whole run (what the table prints); cp_sat_time_s: the CP-SAT calls of the
        # lexicographic stages (and of the conflict search when infeasible)
        solver["cp_sat_time_s"] = res.stats.time_s
        solver["time_s"] = self.total_time_s
        solver["stages"] = [{"name": s.name, "status": s.status.value, "time_s": s.time_s} for s in res.stages]
        solver["cut_short"] = list(self.cut_short)
        plan = self.plan_dict()
        if plan is not None:
            plan["sources"] = {t.name: t.source for t in p.types}
            delivered = self.delivered(plan)
            if delivered is not None:
                plan["delivered"] = delivered
        conflicts = []
        if self.conflict is not None:
            keyed = {k: next((d for d in self.conflict.details if d.startswith(f"{k}: ")), "") for k in self.conflict.keys}
            conflicts = group_conflicts(self.conflict.keys, {k: v[len(str(k)) + 2:] for k, v in keyed.items() if v})
            general = [d for d in self.conflict.details if d not in keyed.values()]
            if general and conflicts:
                conflicts[0]["detail"] = "; ".join(general + ([conflicts[0]["detail"]] if conflicts[0]["detail"] else []))
        return envelope(
            "buildout", p.name, res.status,
            {"name": obj.name, "sense": obj.sense, "value": res.value, "unit": obj.unit_for(p),
             "bound": res.bound, "gap": res.stats.gap, "definition": obj.definition},
            plan, solver,
            binding=[b.to_dict() for b in self.binding],
            conflicts=conflicts,
            definitions=DEFINITIONS,
            achievable=self.achievable,
        )

    # ------------------------------------------------------------------ tables
    def render(self, console) -> None:
        from rich.markup import escape
        from rich.table import Table

        d = self.to_dict()
        res, p = self.solution, self.problem
        o = d["objective"]
        console.print(f"[bold]{p.name}[/bold]  build-out, objective {o['name']} ({o['sense']})  "
                      f"status [bold]{d['status']}[/bold]")
        if self.conflict is not None or res.plan is None:
            print_no_plan(console, self.conflict, self.achievable)
            s = d["solver"]
            console.print(f"solver {s['name']}: {s['time_s']:.3f} s (CP-SAT {s['cp_sat_time_s']:.3f} s)")
            return
        plan = d["plan"]
        for x in d["binding"]:
            if x["family"] in ("rack_power", "rack_feed", "rack_units") and x["slack"] < 0:
                console.print(f"[red]{escape(x['constraint'])}: {escape(x['detail'])}[/red]")
        console.print(f"{o['name']} = {num(o['value'])} {o['unit']} (bound {num(o['bound'])}, gap {d['solver']['gap']:.2%})")
        t = Table(title="Servers")
        for col in ("type", "servers", "GPUs", "power kW", "rack units"):
            t.add_column(col, justify="right" if col != "type" else "left")
        for name, c in plan["servers"].items():
            st = p.type(name)
            t.add_row(name, str(c), str(c * st.gpus), kw(c * st.power_kw), str(c * st.rack_units))
        console.print(t)
        parts = [f"{kw(p.fixed_power_kw)} kW fixed"] if p.fixed_power_kw else []
        if plan["second_tier"]:
            parts.append(f"{kw(p.fabric.second_tier_power_kw)} kW second tier")
        if plan["fabric"] is not None and plan["fabric"]["switch_power_kw"]:
            parts.append(f"{kw(plan['fabric']['switch_power_kw'])} kW switch chips")
        if plan.get("scale_up_domains"):
            parts.append(f"{kw(plan['scale_up_domains']['power_kw'])} kW scale-up fabric")
        extra = f" incl. {' and '.join(parts)}" if parts else ""
        console.print(f"GPUs {plan['gpus']}, power {kw(plan['power_kw'])} of {kw(p.power_budget_kw)} kW{extra}, "
                      f"install units {plan['install_units']} x {p.install_unit_servers} servers"
                      + (f", cost {num(plan['cost'])} {plan['cost_unit']}" if plan["cost"] is not None else ""))
        if plan.get("delivered"):
            dv = plan["delivered"]
            band = (f" (±{dv['tpot_error_band']:.0%}, the source's TPOT band)" if dv["tpot_error_band"] is not None
                    else " (no error band: instances/hardware/fidelity.yaml has none for a GPU of the plan and its "
                          "engine)")
            per = "; ".join(f"{n}: {v['tokens_per_s_per_server']:,.0f} per server ({v['worker']} workers)"
                            for n, v in dv["types"].items())
            console.print(escape(f"delivers {dv['tokens_per_s']:,.0f} tokens/s for the workload{band}; {per}"))
            for n, v in dv["types"].items():
                console.print(escape(f"{n} timed by: {v['timed_by']}"))
        if plan.get("scale_up_domains"):
            sd = plan["scale_up_domains"]
            console.print(escape(f"scale-up domains: {sd['domains']} x {sd['cards_per_domain']} cards, "
                                 f"{sd['switch_chips']:,} switch chips, {sd['port_links']:,} links, "
                                 f"{kw(sd['power_kw'])} kW of fabric" + (f" ({sd['source']})" if sd["source"] else "")))
        feeds = ""
        if p.feed_kw is not None:
            from constraints.buildout.rack_feed import feed_text
            feeds = f" (feeds: {feed_text(p)})"
        r = Table(title=f"Racks: {plan['racks']['air']} air, {plan['racks']['liquid']} liquid{feeds}")
        for col in ("racks", "cooling", "servers per rack", "kW per rack", "U per rack"):
            r.add_column(col)
        for g in plan["rack_layout"]:
            what = [f"{c} x {n}" for n, c in g["servers"].items()]
            if g["switch_chips"]:
                what.append(f"{g['switch_chips']} switch chip{'s' if g['switch_chips'] != 1 else ''}")
            r.add_row(str(g["count"]), g["cooling"], ", ".join(what), kw(g["power_kw"]), str(g["rack_units"]))
        console.print(r)
        if plan["fabric"] is not None:
            fb = plan["fabric"]
            ft = Table(title=f"Fabric: {fb['tiers']} tier(s), {plan['switches']['leaf']} leaf + "
                             f"{plan['switches']['spine']} spine chips, {fb['gpu_links']} GPU links, "
                             f"{fb['leaf_spine_links']} leaf-spine links")
            for col in ("leaf chips", "down", "up", "down GB/s", "up GB/s", "oversubscription"):
                ft.add_column(col, justify="right")
            for g in fb["leaves"]:
                ft.add_row(str(g["count"]), str(g["downlinks"]), str(g["uplinks"]), f"{g['downlink_gb_s']:g}",
                           f"{g['uplink_gb_s']:g}", f"{g['oversubscription']:g}:1" if g["oversubscription"] else "-")
            console.print(ft)
        b = Table(title="Binding limits")
        for col in ("constraint", "slack", "detail"):
            b.add_column(col)
        for x in d["binding"]:
            b.add_row(escape(x["constraint"]), f"{x['slack']:g} {x['unit']}", escape(x["detail"]))
        console.print(b)
        s = d["solver"]
        if res.status == Status.FEASIBLE:
            done = ", ".join(f"{x['name']} {x['status']}" for x in s["stages"])
            why = "time limit: " if all(x["status"] in ("optimal", "feasible", "time_limit") for x in s["stages"]) else ""
            console.print(f"[yellow]{why}not every objective stage is proven optimal ({done})[/yellow]")
        if self.cut_short:
            console.print(f"[yellow]cut short by the time limit: {escape(', '.join(self.cut_short))}[/yellow]")
        console.print(f"solver {s['name']}: {s['status']}, {s['solves']} solves, {s['time_s']:.3f} s "
                      f"(CP-SAT {s['cp_sat_time_s']:.3f} s), bound {num(o['bound'])}, gap {s['gap']:.2%}")

