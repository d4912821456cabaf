"""The day plan's report: result envelope (``to_dict``), tables (``render``) and ``schedule.png``.

The envelope's ``plan`` holds, for the chosen mode and for every mode asked: the schedule (per
window its start, length, rate, workers per configuration, starts, GPUs and simulated
attainment), GPU-hours (and dollars when every pool has a price), the static plan sized for the
peak window (one set of workers all day at the same capacity margins) with its GPU-hours over the
day, and the saving; ``solver`` the last MILP's status, objective, bound, gap and HiGHS time.
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Optional

from optimizer.result import Status, envelope
from optimizer.serving.dayplan import MIP_REL_GAP, DaySolution, ModeDay

DEFINITIONS = {
    "gpu_hours": "GPU-hours over the day: Σ_w GPUs up in window w x its length (h) + each start's GPUs x its "
                 "load time (h)",
    "static_gpu_hours": "GPU-hours of the static plan: the cheapest single set of workers carrying every window's "
                        "(margined) rate, kept all day, plus its starts at the day's start",
    "saving": "1 - gpu_hours / static_gpu_hours (the objective's unit for dollars)",
    "attainment": "share of a window's measured requests meeting both TTFT and TPOT targets, simulated on that "
                  "window's own arrivals (SimPy)",
    "capacity_margin": "factor on a window's rate its capacity was solved for after a simulation below target "
                       "(1 = none)",
    "load_s": "seconds from starting a worker to serving (serving.startup): its GPUs held, not serving",
    "analytic_bound": "the first MILP's bound (every margin 1): a lower bound under the analytic model",
}


class DayReport:
    """The report of a day plan (:class:`~optimizer.serving.dayplan.DaySolution`): ``status``,
    ``to_dict()``, ``render(console)`` and ``write(folder)`` (``schedule.png``)."""

    def __init__(self, solution: DaySolution):
        self.solution = solution
        self.outputs: list[Path] = []

    problem = property(lambda self: self.solution.problem)
    status = property(lambda self: self.solution.status)

    # ------------------------------------------------------------------ envelope
    def mode_dict(self, md: ModeDay) -> dict[str, Any]:
        p, sol = self.problem, self.solution
        r = md.result
        d: dict[str, Any] = {"mode": md.mode, "status": md.status.value, "milp_solves": md.iterations,
                             "time_s": md.time_s}
        d["configurations"] = [{"label": lab, "role": role, "gpus": g, "load_s": ls,
                                "rate_per_worker_rps": list(rates)}
                               for lab, role, g, ls, rates in zip(md.data.labels, md.data.roles_of, md.data.gpus,
                                                                  md.data.load_s, md.data.rates)]
        if md.why:
            d["why"] = md.why
        if r.counts is None:
            d["conflict"] = [str(k) for k in r.conflict]
            d["details"] = list(r.details)
            d["best_attainment"] = list(md.best)
            d["failed_windows"] = [w + 1 for w in md.failed]
            return d
        windows = []
        for w, win in enumerate(p.windows):
            ws = sol.workers[w]
            sim = md.sims[w] if md.sims else None
            windows.append({
                "window": w + 1, "start_min": win.start_s / 60, "length_min": win.length_s / 60,
                "rate_rps": win.rate, "requests": win.requests, "capacity_margin": md.data.margins[w],
                "required_rps": md.data.required[w],
                "workers": {ws[j].label(p): n for j, n in sorted(r.counts[w].items())},
                "starts": {ws[j].label(p): n for j, n in sorted(r.starts[w].items())},
                "gpus": sum(ws[j].gpus * n for j, n in r.counts[w].items()),
                "capacity_rps": {role: sum(ws[j].rate * n for j, n in r.counts[w].items() if ws[j].role == role)
                                 for role in md.data.roles},
                "attainment": sim.attainment if sim is not None else None,
                "simulated": sim.sim.to_dict() if sim is not None and sim.sim is not None else None,
                "simulation_note": (sim.note or None) if sim is not None else None})
        d.update({"objective": r.value, "bound": r.bound, "gap": r.gap, "analytic_bound": md.first.bound,
                  "gpu_hours": r.gpu_hours, "dollars": r.dollars, "peak_gpus": max(x["gpus"] for x in windows),
                  "windows": windows,
                  "solver": {"name": "highs", "status": r.status.value, "objective": r.value, "bound": r.bound,
                             "gap": r.gap, "time_s": r.time_s, "mip_rel_gap": MIP_REL_GAP}})
        st = md.static
        if st is not None and st.counts is not None:
            ws = sol.workers[0]
            d["static"] = {"status": st.status.value, "objective": st.value, "bound": st.bound, "gap": st.gap,
                           "gpu_hours": st.gpu_hours, "dollars": st.dollars,
                           "workers": {ws[j].label(p): n for j, n in sorted(st.counts[0].items())},
                           "gpus": sum(ws[j].gpus * n for j, n in st.counts[0].items()), "time_s": st.time_s}
            d["saving"] = 1.0 - r.value / st.value if st.value else None
            d["saved"] = st.value - r.value
        return d

    @cached_property
    def _dict(self) -> dict[str, Any]:
        p, sol = self.problem, self.solution
        obj = sol.objective
        unit = "GPU-hours" if obj.name == "gpus" else "$"
        modes = {m: self.mode_dict(md) for m, md in sol.modes.items()}
        best = sol.best
        status = self.status
        describe = {**obj.describe(), "unit": unit,
                    "definition": "GPU-hours over the day (GPUs up x window length, plus start-ups' load time)"
                    if obj.name == "gpus" else "dollars over the day (the GPU-hours at each pool's $/GPU-hour)"}
        objective = {**describe, "value": None, "bound": None, "gap": None}
        plan = None
        if best is not None:
            b = modes[best.mode]
            objective = {**describe, "value": b["objective"], "bound": b["bound"], "gap": b["gap"],
                         "analytic_bound": b["analytic_bound"], "mode": best.mode}
            plan = {"kind": "day_plan", "model": p.model.name, "hf_id": p.hf_id, "traffic": p.traffic.source,
                    "slo": {"ttft_ms": p.ttft_s * 1e3, "tpot_ms": p.tpot_s * 1e3, "percentile": p.percentile,
                            "attainment": p.attainment},
                    "startup": self._startup(), "windows": len(p.windows), "best_mode": best.mode,
                    "gpu_hours": b["gpu_hours"], "dollars": b["dollars"],
                    "static_gpu_hours": (b.get("static") or {}).get("gpu_hours"),
                    "saving": b.get("saving"), "modes": modes}
        r = best.result if best is not None else None
        solves = sum(md.iterations + (md.static is not None) for md in sol.modes.values())
        solver = {"name": "highs", "method": "day MILP per mode, per-window simulation cuts",
                  "status": status.value, "time_s": sol.time_s, "model_s": sol.model_s,
                  "distinct_mixes": sol.distinct_mixes, "solves": solves,
                  "milp_time_s": r.time_s if r is not None else None,
                  "objective": r.value if r is not None else None, "bound": r.bound if r is not None else None,
                  "gap": r.gap if r is not None else None}
        cut = []
        if best is not None and best.unchecked:
            names = [p.windows[w].name for w in best.unchecked]
            listed = ", ".join(names) if len(names) <= 6 else f"{', '.join(names[:3])}, ..., {names[-1]}"
            cut.append(f"{len(names)} of {len(p.windows)} windows ({listed}): simulation cut by the time limit "
                       "(SLO not checked)")
        if sol.pooled_windows:
            cut.append(f"{sol.pooled_windows} of {len(p.windows)} windows sized with the whole day's lengths mix, not "
                       "their own: modelling each window's mix took more than its share of the time limit")
        if cut:
            solver["cut_short"] = cut
            solver["unchecked_windows"] = len(best.unchecked) if best is not None else 0
            solver["pooled_windows"] = sol.pooled_windows
        conflicts = []
        if best is None:  # grouped by family, as every problem's conflicts are
            groups: dict[str, list[str]] = {}
            detail: dict[str, list[str]] = {}
            for m, md in sol.modes.items():
                keys = [(k.family, str(k)) for k in md.result.conflict] or \
                       [("attainment", f"attainment[window {w + 1}]") for w in md.failed]  # simulated misses
                for fam, name in keys:
                    groups.setdefault(fam, []).append(f"{m}: {name}")
                for fam in dict.fromkeys(f for f, _ in keys):
                    detail.setdefault(fam, []).append(f"{m}: {md.why}")
            conflicts = [{"family": fam, "count": len(keys), "constraints": keys,
                          "detail": "; ".join(detail[fam])}
                         for fam, keys in groups.items()]
            plan = {"kind": "day_plan", "windows": len(p.windows), "modes": modes}
        alternatives = [{"option": m, "reason": "costlier" if d.get("objective") is not None else d["status"],
                         "detail": (f"{m}: {d['objective']:.4g} {unit}" + (
                             f", {d['objective'] - modes[best.mode]['objective']:.4g} more than {best.mode}"
                             if best is not None else "") if d.get("objective") is not None
                                    else f"{m}: {d.get('why') or d['status']}")}
                        for m, d in modes.items() if best is None or m != best.mode]
        return envelope("serving", p.name, status, objective, plan, solver, alternatives=alternatives,
                        conflicts=conflicts, definitions=DEFINITIONS)

    def to_dict(self) -> dict[str, Any]:
        return self._dict

    def _startup(self) -> dict[str, Any]:
        su = self.problem.startup
        return {"min_uptime_min": su.min_uptime_s / 60, "load_s": su.load_s,
                "storage_gb_s": None if su.storage_bytes_per_s is None else su.storage_bytes_per_s / 1e9,
                "engine_start_s": su.engine_start_s}

    # ------------------------------------------------------------------ files
    def placements(self) -> list[tuple[str, list]]:
        """Per window of the best mode's schedule: (folder tag ``_<window name>``, its workers placed on
        servers, :func:`optimizer.serving.deploy.place`); windows without workers are left out."""
        from optimizer.serving.deploy import place

        s = self.solution
        b = s.best
        if b is None:
            return []
        out = []
        for w, win in enumerate(s.problem.windows):
            counts = {j: c for j, c in b.result.counts[w].items() if c}
            if counts:
                tag = "_" + "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in str(win.name))
                out.append((tag, place(s.problem, s.workers[w], counts)))
        return out

    def write(self, out: Path) -> list[Path]:
        """``--output DIR``: ``schedule.png`` (none without a plan) and, per window of the schedule,
        ``deploy_<window>/`` (the window's workers placed on servers, a script per worker,
        ``router.sh``, ``deployment.json``; ``--deploy kubernetes`` adds the window's manifests):
        scaling between windows is left to the cluster (apply the next window's folder)."""
        from optimizer.plots import NoPlot
        from optimizer.serving import deploy
        from optimizer.serving.dayplots import write

        out.mkdir(parents=True, exist_ok=True)
        files: list[Path] = []
        try:
            files += write(self, out)
        except NoPlot:
            pass
        for tag, placed in self.placements():
            files += deploy.write(self.solution.problem, placed, out, tag)
        return files

    # ------------------------------------------------------------------ tables
    def render(self, console) -> None:
        from rich.markup import escape
        from rich.table import Table

        d = self.to_dict()
        p = self.problem
        o = d["objective"]
        console.print(f"[bold]{escape(p.name)}[/bold]  serving day plan, {len(p.windows)} windows, objective "
                      f"{o['name']} ({o['unit']}), mode {p.mode}  status [bold]{d['status']}[/bold]")
        for line in d["solver"].get("cut_short") or []:
            console.print(escape(f"time limit: {line}" + ("; status feasible, not optimal" if d["status"] == "feasible"
                                                          else "") + ": give more --time-limit"))
        su = d["plan"].get("startup") if d["plan"] else None
        console.print(escape(f"traffic {p.traffic.source}; SLO TTFT {p.ttft_s * 1e3:g} ms, TPOT {p.tpot_s * 1e3:g} ms, "
                             f"p{p.percentile:g}, attainment {p.attainment:.0%}"
                             + (f"; start-up: min up-time {su['min_uptime_min']:g} min" if su else "")))
        for m, md in d["plan"]["modes"].items():
            if "windows" not in md:
                console.print(f"[red]{m}: no day plan[/red] ({escape(md.get('why') or md['status'])})")
                if md.get("best_attainment"):
                    att = ", ".join(f"w{i + 1} {a:.1%}" for i, a in enumerate(md["best_attainment"]) if a is not None)
                    console.print(escape(f"  best simulated attainment reached: {att}"))
                continue
            star = " (chosen)" if d["plan"].get("best_mode") == m else ""
            t = Table(title=f"{m}{star}: schedule")
            labels = [c["label"] for c in md["configurations"]
                      if any(c["label"] in w["workers"] for w in md["windows"])]
            for col in ["window", "start min", "req/s", "margin"] + [lab.replace(" on ", "\n") for lab in labels] + \
                       ["starts", "GPUs", "attain"]:
                t.add_column(col, justify="right")
            for w in md["windows"]:
                starts = sum(w["starts"].values())
                t.add_row(str(w["window"]), f"{w['start_min']:g}", f"{w['rate_rps']:.3g}",
                          f"{w['capacity_margin']:g}", *[str(w["workers"].get(lab, "")) for lab in labels],
                          str(starts or ""), str(w["gpus"]),
                          "-" if w["attainment"] is None else f"{w['attainment']:.1%}")
            console.print(t)
            s = md.get("static")
            line = (f"{m}: {md['gpu_hours']:.3f} GPU-hours"
                    + (f", ${md['dollars']:.2f}" if md.get("dollars") is not None else "")
                    + f"; MILP {md['solver']['status']}, objective {md['objective']:.4g}, bound {md['bound']:.4g}, "
                      f"gap {md['gap']:.2%}, {md['solver']['time_s']:.2f} s HiGHS, {md['milp_solves']} solve(s)")
            console.print(escape(line))
            if s is not None:
                ws = ", ".join(f"{n}x {lab}" for lab, n in s["workers"].items())
                console.print(escape(f"  static plan sized for the peak window: {ws} ({s['gpus']} GPUs) all day, "
                                     f"{s['gpu_hours']:.3f} GPU-hours; the day plan saves {md['saved']:.3f} "
                                     f"{o['unit']} ({md['saving']:.1%})"))
        console.print(f"total time {d['solver']['time_s']:.2f} s ({d['solver']['distinct_mixes']} window models, "
                      f"{d['solver']['model_s']:.2f} s)")
