"""The supernode report: the result envelope (``to_dict``) and the rich tables (``render``)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from optimizer.result import print_no_plan, Binding, Conflict, Status, envelope, group_conflicts
from optimizer.supernode.evaluate import Evaluation
from optimizer.supernode.explain import LIMIT_NAMES, SupernodeExplanation, fabric_dict, limit_text
from optimizer.supernode.perf import SCALE_UP
from optimizer.supernode.schema import GB, Problem
from optimizer.supernode.solve import SupernodeSolution

GENERATED_SHOWN = 12   # generated fabric candidates: the others the table shows besides the chosen and the cuts
GENERATED_CHEAPER = 4  # ... of which at least this many with a cheaper fabric than the chosen one (when there are)

DEFINITIONS = {
    "plan.timing": "the step-time source (performance.source): chapter (eq. 6-15 at the datasheet peaks) or analytic "
                   "(the same roofline on the card's achieved peaks fitted to the measured kernel database), why, and "
                   "its error band: the source's median TPOT error over measured serving runs of the card's GPU "
                   "(None: an inline card or a GPU without runs)",
    "solver.solve_time_s": "CP-SAT time of the lexicographic stages only, seconds (solver.time_s adds model "
                           "building, the independent re-check and the explanation's what-if solves)",
    "weights_per_card_gb": "bytes each card stores for weights, eq 6-14: replicated resident + (routed experts + "
                           "tables in HBM with their projections) / S, GB (1e9 B)",
    "sessions_per_card": "concurrent sessions per card N = floor((C - W_card - U) / K) (eq 6-14), or fewer when "
                         "the per-token target or a tier capacity binds, sessions",
    "kv_per_session_gb": "KV bytes one session holds at the instance's context, K = fixed + per_token x context, GB",
    "step_ms": "decode step with N sessions per card: max(HBM reads / B_HBM, KV-tier reads / B, FLOPs / P) + "
               "2 x MoE layers x T_A2A + prefetch excess + T_fixed, ms",
    "hbm_reads_gb": "bytes one card reads from HBM per step: replicated read + expected routed experts touched "
                    "(uniform routing over N x S tokens) + KV read x N (KV in HBM) + table rows in HBM, GB",
    "t_a2a_us": "one All-to-All (dispatch or combine): latency + N x dispatch bytes x (S-1)/S / link bandwidth (a "
                "candidate fabric: its busiest link; with expert_load: the busiest link under the trace's skew), us",
    "tokens_per_s_per_card": "decode tokens per second per card, N / step, tokens/s",
    "single_user_ms": "batch-1 token, eq 6-15: max(T_weight, T_KV, T_compute) / eta + T_comm + T_fixed with "
                      "T_weight = replicated read / B_HBM and T_comm = 2 x MoE layers x T_A2A(1 token), ms",
    "prefetch_window_us": "time the looked-up rows have to arrive: consuming layer x step / layers (the first "
                          "block for a table at layer 1), us",
    "lookup_bytes_per_token": "bytes of table rows one token looks up: rows per token x row bytes, B",
    "pool_bandwidth_gb_s": "usable memory-pool bandwidth per card, eq 6-12: min(B_path, u x q / L), GB/s",
    "objective.throughput": "decode tokens/s of all instances divided by the cards given, tokens/s per card",
    "objective.sessions": "concurrent sessions of all instances, sessions",
    "objective.cards": "cards used by the instances, cards",
    "objective.single_user": "slowest batch-1 token among the instances built, ms per token",
    "objective.cost": "cards x card_cost_usd + every built domain's fabric cost, USD",
    "fabric_figures": "a candidate fabric for one domain: links (torus links or card/leaf links), port_links "
                      "(card ports used + leaf uplinks), switch_chips, max_hops (links on the farthest path), "
                      "busiest directed link of one uniform All-to-All at the option's batch (MB, GB/s), "
                      "connection state per NIC (KiB) for hosts = S / server_cards, cost (USD), power (kW)",
    "fabric_bill": "switch chips, port links, power (kW) and cost (USD, cards included) of every built domain",
    "fabric_candidates": "generated fabric candidates (supernode.fabric without candidates): topologies made for the "
                         "sizes (tori of 1-3 dims >= 2 per size, one level, two-level down/up splits), candidates = "
                         "topologies x organisations, options cut per limit family, options that can be built, chosen",
    "expert_load": "routing trace whose per-layer expert load fractions (windows summed) skew the All-to-All: each "
                   "card takes its experts' share, the busiest link of dispatch and combine per layer, mean over layers",
}


def _gb(x: float) -> float:
    return round(x / GB, 6)


@dataclass
class SupernodeReport:
    """Result of one supernode run (``status``, ``to_dict()``, ``render(console)``), built once
    from the problem, its solution and the explanation.

    Attributes:
        problem: the resolved problem (its objective included).
        solution: the frozen solution.
        explanation: binding limits, alternatives, flip thresholds, conflict, what is achievable.
        outputs: files written for ``--output`` (none for the supernode).
    """

    problem: Problem
    solution: SupernodeSolution
    explanation: SupernodeExplanation = field(default_factory=SupernodeExplanation)
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
    def alternatives(self) -> tuple[dict[str, Any], ...]:
        return self.explanation.alternatives

    @property
    def thresholds(self) -> list[dict[str, Any]]:
        return list(self.explanation.thresholds)

    @property
    def conflict(self) -> Conflict | None:
        return self.explanation.conflict

    @property
    def achievable(self) -> dict | None:
        """Infeasible: the best any option reaches on what failed."""
        return self.explanation.achievable

    def _instance(self, j: int, count: int) -> dict[str, Any]:
        p, r = self.problem, self.solution.results[j]
        f = r.figures
        return {
            "option": r.option.label(p), "size": r.option.size, "count": count,
            "fabric": (p.fabric.candidates[r.option.candidate].label if r.fabric is not None else
                       "NVLink" if r.option.fabric == SCALE_UP else "NIC-joined servers"),
            "tables": dict(zip([t.name for t in p.inventory.tables], r.option.tables)), "kv": r.option.kv,
            "sessions_per_card": r.sessions_per_card, "sessions": r.sessions_instance * count,
            "limited_by": LIMIT_NAMES.get(r.limit, r.limit), "limit_detail": limit_text(p, r),
            "weights_per_card_gb": _gb(f.weights_per_card), "hbm_used_gb": _gb(f.hbm_used),
            "kv_per_session_gb": _gb(f.kv_per_session), "hbm_reads_gb": _gb(f.hbm_reads),
            "experts_read_gb": _gb(f.experts_read),
            "step_ms": f.step * 1e3,
            "step_parts_ms": {"hbm_reads": f.t_hbm * 1e3, "kv_tier": f.t_kv * 1e3, "compute": f.t_compute * 1e3,
                              "all_to_all": f.t_comm * 1e3, "prefetch_excess": f.prefetch_excess * 1e3,
                              "fixed": p.fixed_s * 1e3},
            "t_a2a_us": f.t_a2a * 1e6,
            "tokens_per_s_per_card": f.tokens_per_s_card,
            "single_user_ms": r.single.token * 1e3, "single_user_tokens_per_s": 1 / r.single.token,
            "single_user_parts_ms": {"weight": r.single.t_weight * 1e3, "kv": r.single.t_kv * 1e3,
                                     "compute": r.single.t_compute * 1e3, "comm": r.single.t_comm * 1e3,
                                     "fixed": r.single.t_fixed * 1e3, "prefetch_excess": r.single.prefetch_excess * 1e3},
            **({"fabric_figures": fabric_dict(p, r)} if r.fabric is not None else {}),
            "prefetch_window_us": r.single.window_first_block * 1e6,
            "prefetch": {t: {(k[:-2] + "_us" if k.endswith("_s") else k): (v * 1e6 if k.endswith("_s") else v)
                             for k, v in d.items()} for t, d in f.prefetch.items()},
        }

    def tiers(self) -> dict[str, Any]:
        p = self.problem
        inv = p.inventory
        out: dict[str, Any] = {"hbm": {"capacity_gb_per_card": _gb(p.hw.memory_bytes),
                                       "bandwidth_gb_s": p.hw.hbm_bandwidth / GB}}
        for name, t in p.hw.tiers.items():
            d = {"scope": t.scope, "capacity_gb": _gb(t.capacity_bytes), "latency_us": t.latency_s * 1e6,
                 "bandwidth_gb_s": t.bandwidth / GB}
            if t.reads_per_s:
                d["random_reads_per_s"] = t.reads_per_s
            if name == "pool":
                d.update(in_flight=t.detail["in_flight"], transaction_bytes=t.transaction_bytes,
                         path_bandwidth_gb_s=t.detail["path_bandwidth_gb_s"],
                         in_flight_for_path=t.detail["in_flight_for_path"])
            if name == "rom":
                d.update(hops=t.detail["hops"], latency_per_hop_us=t.detail["latency_per_hop_us"])
            out[name] = d
        out["prefetch_check"] = self.prefetch_check()
        out["lookups"] = {"rows_per_token": sum(t.rows_per_token for t in inv.tables),
                          "bytes_per_token": sum(t.rows_per_token * t.row_bytes for t in inv.tables),
                          "table_bytes_gb": _gb(inv.table_bytes), "stored_with_tables_gb": _gb(inv.table_extra_bytes)}
        return out

    def prefetch_check(self) -> dict[str, Any]:
        """Each declared tier's fetch of one token's rows (batch 1, every table there) against the
        batch-1 prefetch window of the first chosen instance, us."""
        from optimizer.supernode.perf import Option, fetch_times

        p, res = self.problem, self.solution
        if not p.inventory.tables or not res.plan:
            return {}
        r = res.results[min(res.plan.counts)]
        out = {}
        for tier in p.hw.tiers:
            opt = Option(r.option.size, r.option.fabric, tuple(tier for _ in p.inventory.tables), r.option.kv)
            t, layer = fetch_times(p, opt, 1.0)[tier]
            window = layer * r.single.window_first_block
            out[tier] = {"fetch_us": float(t) * 1e6, "window_us": window * 1e6, "fits": bool(t <= window)}
        return out

    def fabric_bill(self) -> dict[str, Any]:
        """Switch chips, port links, power and cost of every built domain's fabric (from the
        independent evaluation), and per domain the ``buildout.scale_up_domains`` entry the
        build-out problem takes (one per built option)."""
        ev, res, p = self.evaluation, self.solution, self.problem
        domains = []
        for j, count in sorted(res.plan.counts.items()):
            fg = res.results[j].fabric
            if fg is not None:
                domains.append({"domains": count, "cards": fg.size, "switch_chips": fg.switch_chips,
                                "port_links": fg.port_links, "power_kw": round(fg.power_w / 1e3, 6),
                                "cost": round(fg.cost_usd, 2)})
        fabric_cost = sum(d["domains"] * d["cost"] for d in domains)
        return {"switch_chips": ev.switch_chips, "port_links": ev.port_links, "power_kw": ev.fabric_power_w / 1e3,
                "fabric_cost_usd": fabric_cost, "cost_usd": ev.cost_usd, "per_domain": domains}

    def fabric_candidates(self) -> dict[str, Any]:
        """Generated fabric candidates: the topologies made for the problem's sizes (tori per
        size, one level, the two-level splits), how many options each limit cut, how many can
        be built, and the chosen candidate(s)."""
        p, res = self.problem, self.solution
        fs = p.fabric
        tops = fs.topologies
        tori: dict[str, list[str]] = {}
        for t in tops:
            if t.kind == "torus":
                tori.setdefault(str(math.prod(t.dims)), []).append(t.topology_label())
        splits = [f"{t.down_ports}/{t.up_ports}" for t in tops if t.kind == "switched" and t.levels == 2]
        cut: dict[str, int] = {}
        for r in res.results:
            for fam in r.violations:
                cut[fam] = cut.get(fam, 0) + 1
        chosen = sorted({fs.candidates[res.results[j].option.candidate].label for j in res.plan.counts})
        return {"generated": True, "topologies": len(tops), "candidates": len(fs.candidates),
                "organisations": list(dict.fromkeys(c.organisation for c in fs.candidates)),
                "tori": tori, "one_level": any(t.kind == "switched" and t.levels == 1 for t in tops),
                "two_level_splits": splits, "split_step_ports": fs.split_step_ports,
                "options": len(res.results), "cut": dict(sorted(cut.items())),
                "buildable": sum(1 for r in res.results if r.feasible), "chosen": chosen}

    def expert_load(self) -> dict[str, Any]:
        """The routing trace behind the skewed All-to-All and its effect on every built option."""
        from optimizer.supernode.explain import skew_text

        p, res = self.problem, self.solution
        e = p.expert_load
        built = {}
        for j in sorted(res.plan.counts):
            r = res.results[j]
            built[r.option.label(p)] = {"busiest_card_share_x_uniform": e.busiest_card_ratio(r.option.size),
                                        "detail": skew_text(p, r).lstrip("; ")}
        return {"trace": e.file, "format": e.format, "windows": e.windows, "layers": e.layers, "experts": e.experts,
                "placement": "experts in order over the cards (no rebalancing)", "built": built}

    def plan_dict(self) -> dict[str, Any] | None:
        res, ev, p = self.solution, self.evaluation, self.problem
        if res.plan is None or ev is None:
            return None
        return {
            "model": p.inventory.name, "context_tokens": p.context_tokens, "cards": p.cards,
            "cards_used": ev.cards_used, "sessions": ev.sessions, "tokens_per_s": ev.tokens_per_s,
            "tokens_per_s_per_card": ev.tokens_per_s_per_card,
            "single_user_ms": max(i.single_user for i in ev.instances) * 1e3,
            "instances": [self._instance(j, c) for j, c in sorted(res.plan.counts.items())],
            "tiers": self.tiers(),
            "flip_thresholds": self.thresholds,
            **({"fabric_bill": self.fabric_bill()} if p.fabric is not None else {}),
            **({"fabric_candidates": self.fabric_candidates()} if p.fabric is not None and p.fabric.generated else {}),
            **({"expert_load": self.expert_load()} if p.expert_load is not None else {}),
        }

    def to_dict(self) -> dict[str, Any]:
        """The result envelope (:func:`optimizer.result.envelope`) of this supernode plan."""
        res, p = self.solution, self.problem
        obj = res.objective
        gap = res.stats.gap
        plan = self.plan_dict()
        if plan is not None:
            plan["sources"] = {"model": p.inventory.source, "hardware": p.hw.sources}
            plan["timing"] = dict(p.timing)
        conflicts = []
        if self.conflict is not None:
            conflicts = group_conflicts(self.conflict.keys, dict(zip(self.conflict.keys, self.conflict.details)))
            if not conflicts and self.conflict.details:
                conflicts = [{"family": "input", "count": 1, "constraints": [], "detail": "; ".join(self.conflict.details)}]
        alternatives = [{**a, "reason": "chosen" if a["why"] == "chosen" else
                         ("objective" if a["feasible"] else (a.get("limited_by") or "infeasible")),
                         "detail": a["why"]} for a in self.alternatives]
        return envelope(
            "supernode", p.name, res.status,
            {"name": obj.name, "sense": obj.sense, "value": res.value, "unit": obj.unit,
             "bound": res.bound, "gap": gap, "definition": obj.definition},
            plan,
            {"name": res.stats.name, "status": res.status.value, "time_s": res.wall_s + self.explanation.wall_s,
             "solve_time_s": res.stats.time_s, "gap": gap,
             "solves": res.stats.solves,
             "stages": [{"name": n, "status": s.value, "time_s": t} for n, s, t in res.stages],
             **({"cut_short": [f"supernode options: {res.skipped_options} of "
                               f"{res.skipped_options + len(res.results)} not evaluated (time limit)"]}
                if res.skipped_options else {})},
            binding=[b.to_dict() for b in self.binding],
            alternatives=alternatives,
            conflicts=conflicts,
            definitions=DEFINITIONS,
            achievable=self.achievable,
        )

    def _shown_fabrics(self, rows: list[dict]) -> list[dict]:
        """Of the generated candidates' rows: the chosen; of the others that can be built the
        :data:`GENERATED_SHOWN` best by the objective (candidate order among equals), at least
        :data:`GENERATED_CHEAPER` of them the dearest whose fabric costs less than the chosen one's
        (what the saving would miss); the first candidate cut by each limit; in candidate order."""
        from optimizer.supernode.explain import metric

        p, res = self.problem, self.solution
        by_label = {r.option.label(p): r for r in res.results}
        keep = {i for i, x in enumerate(rows) if x["why"] == "chosen"}
        chosen_usd = min((rows[i]["fabric_figures"]["cost_usd"] for i in keep), default=0.0)
        others = [i for i, x in enumerate(rows) if x["feasible"] and i not in keep]
        cheaper = sorted((i for i in others if rows[i]["fabric_figures"]["cost_usd"] < chosen_usd),
                         key=lambda i: (-rows[i]["fabric_figures"]["cost_usd"], i))[:GENERATED_CHEAPER]
        ranked = sorted((i for i in others if i not in cheaper),
                        key=lambda i: (-metric(p, by_label[rows[i]["option"]]), i))
        keep |= set(cheaper) | set(ranked[:GENERATED_SHOWN - len(cheaper)])
        seen: set[str] = set()
        for i, x in enumerate(rows):
            fams = sorted(by_label[x["option"]].violations)
            if fams and fams[0] not in seen:
                seen.add(fams[0])
                keep.add(i)
        return [rows[i] for i in sorted(keep)]

    @staticmethod
    def _generated_lines(gen: dict, total: int, shown: int) -> list[str]:
        tori = "; ".join(f"S={S}: {', '.join(t.removeprefix('torus ') for t in v)}" for S, v in gen["tori"].items())
        splits = gen["two_level_splits"]
        sw = (["switched 1 level"] if gen["one_level"] else []) + (
            [f"{len(splits)} two-level splits {splits[0]} to {splits[-1]} (step {gen['split_step_ports']} port"
             f"{'s' if gen['split_step_ports'] != 1 else ''})"] if splits else [])
        cut = ", ".join(f"{k} {v}" for k, v in gen["cut"].items()) or "none"
        return [f"generated fabric candidates: {gen['topologies']} topologies (tori {tori}; {'; '.join(sw)}) x "
                f"{len(gen['organisations'])} organisation(s) = {gen['candidates']} candidates, {gen['options']} "
                f"options; cut: {cut}; {gen['buildable']} can be built; chosen: {', '.join(gen['chosen'])}",
                f"table: {shown} of {total} candidates (every one in the JSON alternatives)"]

    # ------------------------------------------------------------------ tables
    def render(self, console) -> None:
        from rich.markup import escape
        from rich.table import Table

        d = self.to_dict()
        o, s = d["objective"], d["solver"]
        console.print(f"[bold]{escape(self.problem.name)}[/bold]  supernode sizing, objective {o['name']} "
                      f"({o['sense']})  status [bold]{d['status']}[/bold]")
        tm = self.problem.timing
        b = tm.get("error_band")
        console.print(escape(f"step times: {tm['why']}; " + (
            f"error band: tokens/s per card ±{b['tokens_per_s_error']:.0%} (this source's median TPOT error over "
            f"{b['rows']} measured {b['engine']} runs on this GPU)" if b else
            "no error band (no measured runs of this card)")))
        if d["plan"] is None:
            print_no_plan(console, self.conflict, self.achievable)
            console.print(f"solver {s['name']}: {s['status']}, {s['time_s']:.3f} s")
            for line in s.get("cut_short") or []:
                console.print(escape(f"time limit: {line}: give more --time-limit"))
            return
        plan = d["plan"]
        val = f"{o['value']:,.3f}" if isinstance(o["value"], float) else f"{o['value']:,}"
        bnd = "-" if o["bound"] is None else f"{o['bound']:,.3f}" if isinstance(o["bound"], float) else f"{o['bound']:,}"
        gap_txt = "-" if o["gap"] is None else f"{o['gap']:.2%}"
        console.print(f"{o['name']} = {val} {o['unit']} (bound {bnd}, gap {gap_txt}); "
                      f"{plan['cards_used']} of {plan['cards']} cards, {plan['sessions']:,} sessions, "
                      f"{plan['tokens_per_s_per_card']:,.0f} tokens/s per card, context {plan['context_tokens']:,}")
        t = Table(title="Instances")
        for col in ("count", "S", "fabric", "tables", "KV", "GB/card", "N/card", "limited by",
                    "step ms", "tok/s/card", "batch-1 ms"):
            t.add_column(col)
        for i in plan["instances"]:
            t.add_row(str(i["count"]), str(i["size"]), i["fabric"], ",".join(i["tables"].values()) or "-", i["kv"],
                      f"{i['weights_per_card_gb']:.1f}", str(i["sessions_per_card"]), i["limited_by"],
                      f"{i['step_ms']:.1f}", f"{i['tokens_per_s_per_card']:,.0f}", f"{i['single_user_ms']:.2f}")
        console.print(t)
        a = Table(title="Sizes and placements compared (best of each; why each lost)")
        for col in ("option", "GB/card", "N/card", "step ms", "tok/s/card", "batch-1 ms", "why not"):
            a.add_column(col)
        for x in d["alternatives"]:
            a.add_row(escape(x["option"]), f"{x['weights_per_card_gb']:.1f}", str(x["sessions_per_card"]),
                      "-" if x["step_ms"] is None else f"{x['step_ms']:.1f}",
                      "-" if x["tokens_per_s_per_card"] is None else f"{x['tokens_per_s_per_card']:,.0f}",
                      "-" if x["single_user_ms"] is None else f"{x['single_user_ms']:.2f}",
                      escape(x["why_short"]))
        if self.problem.fabric is None:
            console.print(a)
        else:
            gen = plan.get("fabric_candidates")
            rows = [x for x in d["alternatives"] if x.get("fabric_figures") is not None]
            shown = self._shown_fabrics(rows) if gen else rows
            ft = Table(title="Fabrics compared (one domain each; why each lost)" if not gen else
                       f"Fabrics compared (generated: the chosen, {GENERATED_SHOWN} others by {o['name']} and "
                       f"cheaper fabric, one of each cut; one domain each; why each lost)")
            for col in ("fabric", "links/chips/hops", "busiest link, All-to-All", "N/card", "tok/s/card",
                        "fabric USD", "why not"):
                ft.add_column(col)
            for x in shown:
                fx = x.get("fabric_figures")
                busy = (f"{fx['busiest_link'].split(' (')[0]} {fx['a2a_us']:,.1f} us"
                        if fx.get("busiest_link") and fx.get("a2a_us") else "-")
                ft.add_row(escape(fx["candidate"] if len({a["size"] for a in d["alternatives"]}) == 1
                                  else f"S={x['size']} {fx['candidate']}"), 
                           f"{fx['port_links']:,}/{fx['switch_chips']:,}/{fx['max_hops']}" if fx["port_links"] else "-",
                           escape(busy),
                           str(x["sessions_per_card"]),
                           "-" if x["tokens_per_s_per_card"] is None else f"{x['tokens_per_s_per_card']:,.0f}",
                           f"{fx['cost_usd']:,.0f}",
                           escape(x["why_short"]))
            console.print(ft)
            if gen:
                for line in self._generated_lines(gen, len(rows), len(shown)):
                    console.print(escape(line))
            bill = plan["fabric_bill"]
            console.print(escape(f"fabric bill: {bill['switch_chips']:,} switch chips, {bill['port_links']:,} port "
                                 f"links, {bill['power_kw']:,.2f} kW, {bill['fabric_cost_usd']:,.0f} USD "
                                 f"({bill['cost_usd']:,.0f} USD with the cards)"))
            for dm in bill["per_domain"]:
                console.print(escape(f"for build-out: scale_up_domains: {{cards: {dm['cards']}, switch_chips: "
                                     f"{dm['switch_chips']}, port_links: {dm['port_links']}, power_kw: "
                                     f"{dm['power_kw']:g}, cost: {dm['cost']:.0f}}}"))
        tiers = plan["tiers"]
        lk = tiers["lookups"]
        lines = [f"lookups: {lk['rows_per_token']:g} rows = {lk['bytes_per_token']:,.0f} B per token; "
                 f"prefetch window (first block, batch 1) {plan['instances'][0]['prefetch_window_us']:.1f} us"]
        for tier, c in tiers["prefetch_check"].items():
            lines.append(f"{tier}: one token's rows arrive in {c['fetch_us']:.2f} us, window {c['window_us']:.1f} us: "
                         f"{'fits' if c['fits'] else 'exceeds'}")
        if "host" in tiers:
            h = tiers["host"]
            lines.append(f"host: {h['latency_us']:g} us round trip, {h['random_reads_per_s']:,.0f} reads/s per server, "
                         f"{h['bandwidth_gb_s']:g} GB/s per card, {h['capacity_gb']:,.0f} GB per server")
        if "pool" in tiers:
            q = tiers["pool"]
            lines.append(f"pool (eq 6-12): {q['in_flight']} x {q['transaction_bytes']} B in flight / {q['latency_us']:g} us "
                         f"= {q['bandwidth_gb_s']:.2f} GB/s usable of a {q['path_bandwidth_gb_s']:g} GB/s path; "
                         f"{q['in_flight_for_path']:,} in flight reach the path")
        if "rom" in tiers:
            r = tiers["rom"]
            lines.append(f"rom: {r['hops']} hops x {r['latency_per_hop_us']:g} us, {r['bandwidth_gb_s']:g} GB/s, "
                         f"{r['capacity_gb']:g} GB per card")
        if "expert_load" in plan:
            e = plan["expert_load"]
            lines.append(f"expert load: {e['trace']} ({e['format']}, {e['windows']} windows summed, {e['layers']} layers "
                         f"x {e['experts']} experts, {e['placement']}); All-to-All timed by the busiest link under it")
        for line in lines:
            console.print(escape(line))
        b = Table(title="Binding limits")
        for col in ("constraint", "slack", "detail"):
            b.add_column(col)
        for x in d["binding"]:
            b.add_row(escape(x["constraint"]), f"{x['slack']:,.4g} {x['unit']}", escape(x["detail"]))
        console.print(b)
        for th in plan["flip_thresholds"]:
            console.print(escape(f"flip threshold: {th['detail']}"))
        console.print(f"solver {s['name']}: {s['status']}, {s['solves']} solves, {s['time_s']:.3f} s, "
                      f"bound {bnd}, gap {gap_txt}")
        for line in s.get("cut_short") or []:
            console.print(escape(f"time limit: {line} (the status and bound cover the evaluated ones only)"))
