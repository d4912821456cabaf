"""The serving report: result envelope (``to_dict``), tables (``render``) and launch scripts."""
from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

from optimizer.result import Status, envelope
from optimizer.serving.explain import ServingExplanation, plan_conflict
from optimizer.serving.launch import commands, launch_notes
from optimizer.serving.schema import HF_ID_PLACEHOLDER
from optimizer.serving.solution import NOT_BEGUN, ModePlan, RateResult, ServingSolution

DEFINITIONS = {
    "dtypes": "weight_dtype and kv_dtype the plan is sized and timed with, and where each came from: the instance "
              "(model.weight_dtype / model.kv_dtype), else the checkpoint's quantization_config and what the "
              "timing engine stores for it with its KV-cache option at auto (instances/engines/kv_defaults.yaml)",
    "ttft_ms": "time to first token: queue wait + prefill (+ KV transfer when disaggregated), ms; analytic at the "
               "checked quantile (max(percentile, 1-(1-attainment)/2)), simulated p50/p90/p99",
    "tpot_ms": "time per output token after the first: (last token - first token)/(OSL-1), ms",
    "attainment": "share of requests meeting both TTFT and TPOT targets (DistServe's SLO attainment), simulated",
    "tokens_per_s": "output tokens per second of the plan at the rate served, tokens/s",
    "tokens_per_s_per_gpu": "output tokens/s divided by the plan's GPUs (aiconfigurator's tokens/s/GPU)",
    "tokens_per_s_per_user": "1 / mean TPOT: tokens/s one request sees while decoding (aiconfigurator's tokens/s/user)",
    "rate_per_worker_rps": "largest request rate each worker sustains within the SLOs (analytic), req/s: in a plan's "
                           "worker group, at the group's count (prefill workers of one configuration share one prompt "
                           "queue, so more of them carry more each); in configurations, one worker alone",
    "homogeneous": "serving.homogeneous: at most one worker configuration per role (plan and bound are for that restricted problem)",
    "pooling": "prefill configurations: [[n, rate per worker at n workers sharing one prompt queue, req/s], ...] at the "
               "breakpoints the MILP uses (empty: no pooling gain)",
    "load_rps": "request rate each worker of the group gets in the plan (the rate split in proportion to rate_per_worker_rps)",
    "max_batch": "decodes a worker admits (--max-num-seqs / --max-running-requests): KV memory at the mean request "
                 "length (eq 6-1) capped by serving.max_batch; prompts in flight (one per DP rank) for prefill",
    "capacity_margin": "extra capacity the plan was solved for after a simulation below target (1 = none)",
    "capacity_margin_by_role": "the simulated[role] cuts: rated capacity asked of each role as a factor of the rate "
                               "(trace: from the trace's own bursts, then the simulated shortfall)",
    "binding": "what caps each chosen configuration's rate (ttft, tpot, kv_memory, kv_link, max_batch), pool GPUs "
               "and role capacity, with slack",
}


class ServingReport:
    """The report of a serving solve, built once from the frozen solution and its explanation:
    ``status``, ``to_dict()`` (the result envelope), ``render(console)`` (tables) and
    ``write(folder)`` (the launch scripts)."""

    def __init__(self, solution: ServingSolution, explanation: ServingExplanation):
        self.solution = solution
        self.explanation = explanation

    # the solution's parts, as the report's readers (sweep, pareto, tests) name them
    problem = property(lambda self: self.solution.problem)
    model = property(lambda self: self.solution.model)
    workers = property(lambda self: self.solution.workers)
    objective = property(lambda self: self.solution.objective)
    results = property(lambda self: self.solution.results)
    achievable = property(lambda self: self.explanation.achievable)
    status = property(lambda self: self.solution.status)

    @property
    def time_s(self) -> float:
        """Wall time of the solve and of the explanation's solves, s."""
        return self.solution.time_s + self.explanation.time_s

    def best(self, rr: RateResult) -> ModePlan | None:
        return self.solution.best(rr)

    def gpus(self, m: ModePlan) -> int:
        return self.solution.gpus(m)

    def dollars(self, m: ModePlan) -> float | None:
        return self.solution.dollars(m)

    def conflict_groups(self) -> list[dict[str, Any]]:
        return list(self.explanation.conflicts)

    def _groups(self, m: ModePlan) -> list[dict[str, Any]]:
        p, sm = self.problem, self.model
        counts = m.result.counts or {}
        cap = {}
        for j, n in counts.items():
            w = self.workers[j]
            cap[w.role] = cap.get(w.role, 0.0) + w.capacity(n)
        out = []
        for j, n in sorted(counts.items()):
            w = self.workers[j]
            lam = m.rate * w.per_worker_rate(n) / cap[w.role]
            if w.role == "prefill":
                f = sm.prefill_figures(w, lam, n)
                an = {"ttft_ms": f["ttft_s"] * 1e3, "wait_ms": f["wait_s"] * 1e3, "prefill_ms": f["prefill_s"] * 1e3,
                      "kv_transfer_ms": (f["transfer_s"] + f["link_wait_s"]) * 1e3, "utilisation": f["utilisation"],
                      "link_utilisation": f["link_utilisation"]}
            elif w.role == "decode":
                f = sm.decode_figures(w, lam)
                an = {"tpot_ms": f["tpot_s"] * 1e3, "mean_tpot_ms": f["mean_tpot_s"] * 1e3, "batch": f["batch"],
                      "batch_at_quantile": f["batch_q"]}
            else:
                f = sm.aggregated_figures(w, lam)
                an = {"ttft_ms": f["ttft_s"] * 1e3, "tpot_ms": f["tpot_s"] * 1e3, "mean_tpot_ms": f["mean_tpot_s"] * 1e3,
                      "batch": f["batch"], "batch_at_quantile": f["batch_q"], "chunk_share": f["chunk_share"]}
            pool = p.pools[w.pool]
            out.append({"role": w.role, "pool": pool.name, "gpu": pool.gpu, "layout": w.layout.label(),
                        "layout_detail": w.layout.as_dict(), "count": n, "gpus_per_worker": w.gpus,
                        "gpus": w.gpus * n, "gpus_per_server": pool.hw.server.gpus, "max_batch": w.max_batch,
                        "rate_per_worker_rps": w.per_worker_rate(n),
                        "load_rps": lam, "limited_by": w.limit,
                        "limit_detail": sm.prefill_detail(w, n) if w.role == "prefill" and w.pooling and n > 1 else w.detail, "analytic": an,
                        "launch": commands(p, w)})
            notes = launch_notes(p, w)
            if notes:
                out[-1]["launch_notes"] = notes
        return out

    def _analytic(self, groups: list[dict], m: ModePlan) -> dict[str, Any]:
        ttft = max((g["analytic"].get("ttft_ms", 0.0) for g in groups), default=0.0)
        tpot = max((g["analytic"].get("tpot_ms", 0.0) for g in groups), default=0.0)
        mean_tpot = max((g["analytic"].get("mean_tpot_ms", 0.0) for g in groups), default=0.0)
        tps = m.rate * self.problem.traffic.mean_osl
        return {"quantile": self.problem.quantile, "ttft_ms": ttft, "tpot_ms": tpot, "tokens_per_s": tps,
                "tokens_per_s_per_gpu": tps / max(self.gpus(m), 1),
                "tokens_per_s_per_user": 1e3 / mean_tpot if mean_tpot else None}

    def mode_dict(self, m: ModePlan) -> dict[str, Any]:
        d: dict[str, Any] = {"mode": m.mode, "status": "ok" if m.ok else m.result.status.value}
        c = plan_conflict(self.solution, m)
        if c is not None:
            d["conflict"] = c.to_dict()
            d["status"] = (m.result.status.value if m.result.status == Status.TIME_LIMIT else
                           Status.NOT_FOUND.value if self.problem.concurrency is not None else Status.INFEASIBLE.value)
            if m.result.counts is None:
                return d
        groups = self._groups(m)
        d.update({"objective": m.result.value, "bound": m.result.bound, "gpus": self.gpus(m),
                  "dollars_per_hour": self.dollars(m), "rate_rps": m.rate, "capacity_margin": m.margin,
                  "capacity_margin_by_role": dict(m.role_margins),
                  "workers": groups, "analytic": self._analytic(groups, m),
                  "simulated": m.sim.to_dict() if m.sim is not None else None,
                  "simulation_cut_short": m.sim_cut,
                  "solver": {"status": m.result.status.value, "time_s": m.result.time_s, "solves": m.result.solves}})
        return d

    # ------------------------------------------------------------------ envelope
    def rates(self) -> list[dict[str, Any]]:
        """Per rate: best mode, every mode's plan (or conflict) and why the other mode lost."""
        return self._rates

    @cached_property
    def _rates(self) -> list[dict[str, Any]]:
        out = []
        for rr, lost in zip(self.results, self.explanation.alternatives):
            b = self.best(rr)
            out.append({"rate_rps": rr.rate, "best_mode": b.mode if b else None,
                        "modes": {k: self.mode_dict(m) for k, m in rr.plans.items()},
                        "why_other_mode_lost": [dict(a) for a in lost]})
        return out

    def to_dict(self) -> dict[str, Any]:
        """The result envelope (:func:`optimizer.result.envelope`, problem ``serving``)."""
        return self._dict

    @cached_property
    def _dict(self) -> dict[str, Any]:
        p, obj = self.problem, self.objective
        rates = self.rates()
        last = self.solution.headline()
        best = self.best(last)
        status = self.status
        objective = {**obj.describe(), "value": None, "bound": None, "gap": None}
        if best is not None:
            val = best.result.value
            bound = best.result.bound
            gap = abs(val - bound) / max(abs(val), 1e-12) if bound is not None else None
            objective = {**obj.describe(), "value": val, "bound": bound, "gap": gap, "rate_rps": last.rate,
                         "mode": best.mode}
        plan = None
        if best is not None:
            plan = {"model": p.model.name, "hf_id": p.hf_id, "traffic": p.traffic.source, "slo": self.slo_dict(),
                    "mode_asked": p.mode, "timing": p.timing, "slo_margin": p.slo_margin,
                    "dtypes": p.dtypes.as_dict() if p.dtypes is not None else None,
                    "kv_link": {"bandwidth_gb_s": p.kv_link.bandwidth_bytes_per_s / 1e9,
                                "latency_us": p.kv_link.alpha_s * 1e6, "default": p.kv_link_default,
                                "kv_transfer": p.kv_transfer},
                    "chunk_tokens": p.chunk_tokens, "homogeneous": p.homogeneous, "best_mode": best.mode, "rates": rates,
                    "configurations": [{"label": w.label(p), "gpus": w.gpus, "max_batch": w.max_batch,
                                        "rate_per_worker_rps": w.rate, "pooling": [list(x) for x in w.pooling],
                                        "limited_by": w.limit, "detail": w.detail}
                                       for w in self.workers]}
        alternatives = [a for r in rates for a in r["why_other_mode_lost"]]
        solves = sum(m.result.solves for rr in self.results for m in rr.plans.values())
        notes = []
        if p.hf_id == HF_ID_PLACEHOLDER:
            notes.append("no model.hf_id: the launch commands say MODEL; replace it with the model's name or folder")
        if p.weight_dtype == "int4":
            notes.append("weights int4: serve a 4-bit checkpoint (AWQ/GPTQ) as the launch commands' model; the engines "
                         "read its quantization from it (a BF16 checkpoint would not fit the planned GPUs)")
        cp_workers = [self.workers[j] for j in sorted((best.result.counts or {}) if best is not None else {})
                      if self.workers[j].layout.cp > 1]
        if cp_workers:
            labels = ", ".join(sorted({w.layout.label() for w in cp_workers}))
            notes.append(f"context-parallel prefill ({labels}): timed with the K/V {p.pools[0].perf.cp_kv_exchange} "
                         f"exchange (serving.cp_kv_exchange); "
                         + ("; ".join(launch_notes(p, cp_workers[0])) or "SGLang --attn-cp-size command"))
        cut = self.cut_short()
        if cut:
            notes.append("cut short by the time limit: " + "; ".join(cut))
        out = envelope("serving", p.name, status, objective, plan,
                       {"name": "highs", "status": status.value, "time_s": self.time_s,
                        "gap": objective["gap"] if objective else None, "solves": solves, "cut_short": cut},
                       binding=[b.to_dict() for b in self.explanation.binding] if best else [],
                       alternatives=alternatives,
                       conflicts=(list(self.explanation.conflicts)
                                  if status in (Status.INFEASIBLE, Status.NOT_FOUND, Status.TIME_LIMIT) else []),
                       achievable=self.achievable,
                       definitions=DEFINITIONS, notes=notes or None)
        return out

    def cut_short(self) -> list[str]:
        """What the time limit cut: the plans whose simulation it ended (their checks are the
        analytic model's alone; the first three named, the rest counted), and the (rate, mode)
        solves it left unbegun (counted)."""
        cut = [(rr.rate, m) for rr in self.results for m in rr.plans.values() if m.sim_cut]
        # a closed loop's open-loop sizing is no check of it: only its simulation is (closed_loop_rates)
        check = ("NOT checked: a closed loop is checked by its simulation only (sized for the open-loop rate; "
                 "give more time)" if self.problem.concurrency is not None else "checked by the analytic model only")
        out = [f"simulation of {m.mode} at {rate:g} req/s ({m.sim_cut}): the plan is {check}" for rate, m in cut[:3]]
        if len(cut) > 3:
            out.append(f"and {len(cut) - 3} more simulations (up to {cut[-1][0]:g} req/s): those plans are {check}")
        unsolved = [(rr.rate, m.mode) for rr in self.results for m in rr.plans.values()
                    if m.result.counts is None and m.result.status == Status.TIME_LIMIT and m.result.solves == 0]
        if unsolved:
            out.append(f"{len(unsolved)} of {sum(len(rr.plans) for rr in self.results)} (rate, mode) solves not begun "
                       f"before the time limit (from {unsolved[0][0]:g} req/s {unsolved[0][1]})")
        return out

    def slo_dict(self) -> dict[str, Any]:
        p = self.problem
        return {"ttft_ms": p.ttft_s * 1e3, "tpot_ms": p.tpot_s * 1e3, "percentile": p.percentile,
                "attainment": p.attainment, "checked_quantile": p.quantile}

    # ------------------------------------------------------------------ scripts
    def placements(self) -> list[tuple[str, list]]:
        """Per solved rate: (folder tag, the best plan's workers placed on servers, :func:`deploy.place`)."""
        from optimizer.serving.deploy import place

        out = []
        for rr in self.results:
            b = self.best(rr)
            if b is None or not b.result.counts:
                continue
            tag = f"_{rr.rate:g}rps" if len(self.results) > 1 else ""
            out.append((tag, place(self.problem, self.workers, b.result.counts)))
        return out

    def write(self, out: Path) -> list[Path]:
        """``deploy/`` (:mod:`optimizer.serving.deploy`: the workers placed on servers, one script per
        worker, ``router.sh``, ``deployment.json``; ``optimize --deploy kubernetes`` adds the manifests) and
        ``launch_<mode>_<role>_<layout>_<pool>_<engine>.sh`` for each worker group of each
        rate's best plan. A script is run once per worker with its slot on the server
        (``./launch_….sh 0``, ``1``, …): the slot picks the worker's own GPUs
        (``CUDA_VISIBLE_DEVICES``) and port (the engine's default port plus the slot), so workers
        sharing a server do not collide. A worker wider than a server has one slot (all GPUs of
        each of its servers); the engine's multi-node options are not generated."""
        out.mkdir(parents=True, exist_ok=True)
        files = []
        d = self.to_dict()
        for r in d["plan"]["rates"] if d["plan"] else []:
            if r["best_mode"] is None:
                continue
            m = r["modes"][r["best_mode"]]
            for g in m["workers"]:
                for engine, cmd in g["launch"].items():
                    tag = f"{r['best_mode']}_{g['role']}_{g['layout'].replace(' ', '').replace('/', '-')}_{g['pool']}"
                    suffix = f"_{r['rate_rps']:g}rps" if len(d["plan"]["rates"]) > 1 else ""
                    f = out / f"launch_{tag}{suffix}_{engine}.sh"
                    f.write_text(_slot_script(f.name, cmd, g, self.problem.weight_dtype))
                    f.chmod(0o755)
                    files.append(f)
        from optimizer.serving import deploy

        for tag, placed in self.placements():
            files += deploy.write(self.problem, placed, out, tag)
        return files

    # ------------------------------------------------------------------ tables
    def render(self, console) -> None:
        from rich.markup import escape
        from rich.table import Table

        d = self.to_dict()
        p = self.problem
        o = d["objective"]
        console.print(f"[bold]{escape(p.name)}[/bold]  serving, objective {self.objective.name} "
                      f"({self.objective.sense}), mode {p.mode}  status [bold]{d['status']}[/bold]")
        console.print(escape(f"traffic {p.traffic.source}; SLO TTFT {p.ttft_s * 1e3:g} ms, TPOT {p.tpot_s * 1e3:g} ms, "
                             f"p{p.percentile:g}, attainment {p.attainment:.0%} (analytic checks each at the "
                             f"{p.quantile:.0%} quantile); kv_link {p.kv_link.bandwidth_bytes_per_s / 1e9:g} GB/s per GPU, "
                             f"kv_transfer {p.kv_transfer}"))
        for name, t in p.timing.items():
            b = t["error_band"]
            band_txt = (f"measured error band TTFT ±{b['ttft_median_abs_error']:.0%}, TPOT ±{b['tpot_median_abs_error']:.0%} "
                        f"(median over {b['rows']} {t['engine']} runs)" if b else "uncalibrated")
            console.print(escape(f"timed by: {t['why']} ({name}); {band_txt}"))
        if p.dtypes is not None and p.dtypes.derived:  # a default read from a quantized checkpoint
            console.print(escape(p.dtypes.line()), soft_wrap=True)
        if p.slo_margin is not None:
            m = p.slo_margin
            console.print(escape(f"slo_margin band: planned to TTFT {p.ttft_s * 1e3:.0f} ms and TPOT {p.tpot_s * 1e3:.1f} ms "
                                 f"(asked {m['ttft_ms_asked']:g} / {m['tpot_ms_asked']:g} ms, less the band's "
                                 f"{m['ttft_error']:.0%} / {m['tpot_error']:.0%})"))
        rates = self.rates()
        t = Table(title="Plans (analytic | simulated; * the best mode)")
        q = f"p{p.quantile * 100:g}"  # the analytic column's quantile; the simulated one is p90
        for col in ("rate/s", "mode", "GPUs", "$/h", "workers", f"TTFT ms a {q}|sim p90", f"TPOT ms a {q}|sim p90", "attain",
                    "tok/s/GPU", "tok/s/user"):
            t.add_column(col)
        for r in rates:
            for mode, m in r["modes"].items():
                star = "*" if mode == r["best_mode"] else ""
                if "workers" not in m:
                    t.add_row(f"{r['rate_rps']:g}", mode, "-", "-", escape(m["status"]), "-", "-", "-", "-", "-")
                    continue
                a, s = m["analytic"], m["simulated"]
                ws = ", ".join(f"{g['count']}x {g['role'][0].upper()} {g['layout']} {g['gpu']}" for g in m["workers"])
                sim = (lambda k, q: f"{s[k][q]:.0f}" if s else "-")
                t.add_row(f"{m['rate_rps']:.4g}", star + mode, str(m["gpus"]),
                          "-" if m["dollars_per_hour"] is None else f"{m['dollars_per_hour']:.1f}", escape(ws),
                          f"{a['ttft_ms']:.0f} | {sim('ttft_ms', 'p90')}",
                          f"{a['tpot_ms']:.1f} | " + (f"{s['tpot_ms']['p90']:.1f}" if s else "-"),
                          f"{s['attainment']:.1%}" if s else "-",
                          f"{a['tokens_per_s_per_gpu']:.0f} | " + (f"{s['tokens_per_s_per_gpu']:.0f}" if s else "-"),
                          (f"{a['tokens_per_s_per_user']:.0f}" if a["tokens_per_s_per_user"] else "-") + " | " +
                          (f"{s['tokens_per_s_per_user']:.0f}" if s else "-"))
        console.print(t)
        for line in self.cut_short():
            console.print(f"[yellow]cut short by the time limit: {escape(line)}[/yellow]")
        for r in rates:
            for w in r["why_other_mode_lost"] if len(r["modes"]) > 1 else []:
                if not w["detail"].endswith(NOT_BEGUN):  # counted in the cut-short line
                    console.print(escape(f"why not {w['detail']}"))
        if d["status"] in (Status.INFEASIBLE.value, Status.NOT_FOUND.value):
            console.print("[red]No plan meets the SLOs.[/red]" if d["status"] == Status.INFEASIBLE.value else
                          "[red]No plan found for the closed loop[/red] (a search, not a proof: the open-loop sizing "
                          "model's limits below, and closed-loop simulations of smaller sizings that missed)")
            if self.achievable:
                console.print(f"[bold]best achievable[/bold]: {escape(self.achievable['detail'])}")
            console.print("Conflicting constraints:")
            for c in d["conflicts"]:
                console.print(escape(f"  {c['family']} ({c['count']}): {', '.join(c['constraints'][:6])}"))
                for line in c["details"][:6]:
                    console.print(escape(f"    - {line}"))
            console.print(f"solver highs: {d['solver']['status']}, {d['solver']['time_s']:.2f} s")
            return
        solved = [r for r in rates if r["best_mode"] is not None]
        if not solved:  # the time limit ended the run before any rate had a plan
            console.print(f"[yellow]no plan within the time limit[/yellow]; solver highs: {d['solver']['status']}, "
                          f"{d['solver']['time_s']:.2f} s")
            return
        last = solved[-1]
        best = last["modes"][last["best_mode"]]
        g = Table(title=f"Workers of the best plan ({last['best_mode']}, {last['rate_rps']:g} req/s)")
        for col in ("role", "count", "layout", "GPU", "max batch", "req/s max", "load", "limited by"):
            g.add_column(col)
        for x in best["workers"]:
            g.add_row(x["role"], str(x["count"]), x["layout"], x["gpu"], str(x["max_batch"]),
                      f"{x['rate_per_worker_rps']:.3g}", f"{x['load_rps']:.3g}", escape(x["limited_by"]))
        console.print(g)
        b = Table(title="Binding limits")
        for col in ("constraint", "slack", "detail"):
            b.add_column(col)
        for x in d["binding"]:
            b.add_row(escape(x["constraint"]), f"{x['slack']:.4g} {x['unit']}", escape(x["detail"]))
        console.print(b)
        console.print("[bold]Launch commands[/bold] (one per worker; --output DIR writes them as scripts)")
        if p.hf_id == HF_ID_PLACEHOLDER:
            console.print("  (no model.hf_id in the instance: replace MODEL with the model's name or folder)")
        if p.weight_dtype == "int4":
            console.print("  (weights int4: serve a 4-bit checkpoint (AWQ/GPTQ) as the model; a BF16 one would not fit)")
        for x in best["workers"]:
            for engine, cmd in x["launch"].items():
                console.print(escape(f"  [{x['role']} x{x['count']}] {cmd}"), soft_wrap=True)
            for note in x.get("launch_notes", []):
                console.print(escape(f"  [{x['role']} x{x['count']}] ({note})"), soft_wrap=True)
        at = f" at {o['rate_rps']:g} req/s" if o.get("rate_rps") is not None else ""
        console.print(f"solver highs: {d['solver']['status']}, {d['solver']['solves']} solves, "
                      f"{d['solver']['time_s']:.2f} s, {o['name']} = {o['value']:.4g} {o['unit']}{at} "
                      + ("(no bound)" if o["bound"] is None else
                         f"(bound {o['bound']:.4g}, gap {(o['gap'] or 0):.2%})"))
        if len(solved) < len(rates):
            console.print(f"[yellow]the sweep is not answered: {len(rates) - len(solved)} of {len(rates)} rates have no "
                          f"plan within the time limit; the objective is the largest rate solved ({last['rate_rps']:g} "
                          f"req/s)[/yellow]")


def _slot_script(name: str, cmd: str, g: dict, weight_dtype: str = "bf16") -> str:
    """A launch script taking the worker's slot on its server (see :meth:`ServingReport.write`); ``cmd``
    ends with ``--port N`` (:mod:`optimizer.serving.launch`), the first slot's port. ``GPUS``
    and ``PORT`` in the environment override the slot's (workers of other layouts on the same
    server: the plan counts workers, it does not place them on servers)."""
    base, port = cmd.rsplit(" --port ", 1)
    per_gpu, per_server = int(g["gpus_per_worker"]), int(g["gpus_per_server"])
    slots = max(1, per_server // per_gpu)
    width = min(per_gpu, per_server)
    cases = "\n".join(f"  {k}) gpus={','.join(str(k * width + i) for i in range(width))} ;;" for k in range(slots))
    wide = ("" if per_gpu <= per_server else
            f"# each worker spans {-(-per_gpu // per_server)} servers: run it on each with the engine's multi-node "
            "options (not generated)\n")
    int4 = ("# weights int4: MODEL must be a 4-bit checkpoint (AWQ/GPTQ); a BF16 one does not fit these GPUs\n"
            if weight_dtype == "int4" else "")
    return (f"#!/bin/sh\n# {g['count']} worker(s) of {per_gpu} {g['gpu']} GPUs each, {slots} per server of "
            f"{per_server} GPUs.\n{wide}{int4}# Run once per worker: ./{name} SLOT (SLOT 0..{slots - 1} on each "
            f"server picks the worker's GPUs and port {port} + SLOT).\n"
            f"# Workers of other scripts on the same server: give each its own GPUS=0,1,.. and PORT=...\n"
            f"if [ $# -ne 1 ]; then echo \"usage: {name} SLOT (0..{slots - 1})\" >&2; exit 2; fi\n"
            f"slot=$1\ncase \"$slot\" in\n{cases}\n"
            f"  *) echo \"{name}: slot must be 0..{slots - 1} ({slots} worker(s) per server)\" >&2; exit 2 ;;\nesac\n"
            f"export CUDA_VISIBLE_DEVICES=${{GPUS:-$gpus}}\nexec {base} --port ${{PORT:-$(({port} + slot))}}\n")
