"""Pareto fronts of a serving instance: tokens/s/GPU against tokens/s/user over SLO targets.

Every point is one proven-optimal MILP solve (:func:`optimizer.serving.solve_instance`, analytic
model, no simulation margin) of the instance at one TPOT target (and, for ``ttft``, one TTFT
target), per mode. ``tokens/s/GPU`` = served rate x mean OSL / the plan's GPUs; ``tokens/s/user``
= 1 / the plan's analytic mean TPOT (the report's definitions, aiconfigurator's axes). The front of
a curve keeps the points no other point of the curve dominates (at least as fast per user and
strictly more per GPU, or the reverse), so along the front more tokens/s/user never gives more
tokens/s/GPU.

Warm start: the targets are visited from the loosest to the tightest and one
:class:`~optimizer.serving.perf.ServingModel` is :meth:`retargeted <ServingModel.retarget>` from
one target to the next, so every step-time table and prefill time is computed once per sweep.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np

from optimizer.budget import Budget
from optimizer.result import Status
from optimizer.serving.perf import ServingModel
from optimizer.serving.solve import MODE_ROLES
from optimizer.serving.schema import Problem

TPOT_SPAN = (0.25, 4.0)       # default TPOT targets: geometric from 1/4 to 4x the instance's
TTFT_FACTORS = (0.5, 1.0, 2.0)  # --pareto ttft: the instance's TTFT target times these
MODES = ("aggregated", "disaggregated")


@dataclass
class Point:
    """One solve: ``mode`` at ``tpot_ms``/``ttft_ms`` targets; ``status`` of the solve (``ok`` only
    when proven optimal), ``gpus``, ``objective`` value, axes and the plan's label."""

    mode: str
    tpot_ms: float
    ttft_ms: float
    status: str
    objective: float | None = None
    gpus: int | None = None
    tokens_per_s_per_gpu: float | None = None
    tokens_per_s_per_user: float | None = None
    label: str = ""
    reason: str = ""
    on_front: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Curve:
    mode: str
    ttft_ms: float
    points: list[Point] = field(default_factory=list)

    @property
    def front(self) -> list[Point]:
        return sorted((q for q in self.points if q.on_front), key=lambda q: q.tokens_per_s_per_user)


@dataclass
class ParetoResult:
    problem: Problem
    objective: str
    rate_rps: float
    curves: list[Curve]
    time_s: float
    solves: int
    not_solved: int = 0  # targets the time limit left unsolved
    achievable: Optional[dict] = None  # no front: the best the instance's SLOs reach (as a plain run's)

    def to_dict(self) -> dict[str, Any]:
        """The result envelope (:func:`optimizer.result.envelope`, problem ``serving-pareto``):
        ``plan`` holds the rate, the axes and the curves (each with its front and every point);
        ``objective`` names the instance's objective (no single value: one per point)."""
        from objectives.serving import registry

        from optimizer.result import Status, envelope

        p = self.problem
        on_front = sum(len(c.front) for c in self.curves)
        # each front point is a proven optimum; a front the time limit cut short is not the whole front
        status = (Status.FEASIBLE if self.not_solved else Status.OPTIMAL) if on_front else \
            (Status.TIME_LIMIT if self.not_solved else Status.INFEASIBLE)
        reason = ("" if on_front else "no target gives a proven-optimal plan at this rate (see each point's reason)"
                  + ("; some targets were not solved before the time limit" if self.not_solved else ""))
        obj = registry()[self.objective]
        cut = [f"{self.not_solved} targets not solved before the time limit"] if self.not_solved else []
        plan = {"rate_rps": self.rate_rps, "traffic": p.traffic.source, "axes": {
                    "x": "tokens_per_s_per_user: 1 / analytic mean TPOT of the plan, tokens/s",
                    "y": "tokens_per_s_per_gpu: served rate x mean OSL / GPUs of the plan, tokens/s"},
                "curves": [{"mode": c.mode, "ttft_ms": c.ttft_ms, "front": [q.to_dict() for q in c.front],
                            "points": [q.to_dict() for q in c.points]} for c in self.curves]}
        return envelope("serving-pareto", p.name, status,
                        {"name": obj.name, "value": None, "unit": obj.unit, "bound": None, "gap": None,
                         "definition": "one value per point (each point's objective)", "sense": obj.sense},
                        plan, {"name": "highs", "status": status.value, "time_s": self.time_s, "gap": None,
                               "solves": self.solves, "cut_short": cut},
                        reason=reason or None, achievable=self.achievable)


def default_tpot_targets_ms(p: Problem, points: int = 20) -> list[float]:
    """``points`` TPOT targets (ms), geometric over :data:`TPOT_SPAN` times the instance's target."""
    lo, hi = TPOT_SPAN
    return [float(x) for x in np.geomspace(p.tpot_s * 1e3 * lo, p.tpot_s * 1e3 * hi, points)]


def mark_front(points: list[Point]) -> None:
    """Set ``on_front`` on the non-dominated ``ok`` points (max both axes); ties on both axes keep
    the first point (tightest target)."""
    ok = [q for q in points if q.status == "ok"]
    for q in points:
        q.on_front = False
    ok.sort(key=lambda q: (-q.tokens_per_s_per_user, -q.tokens_per_s_per_gpu))
    best_y = -math.inf
    for q in ok:
        if q.tokens_per_s_per_gpu > best_y * (1 + 1e-12) + 1e-12:
            q.on_front = True
            best_y = q.tokens_per_s_per_gpu


def plan_label(rep, m) -> str:
    """``"2x TP4"`` (aggregated) or ``"P 1x TP2 + D 3x TP4"`` (disaggregated), pool names when several."""
    parts = []
    several = len(rep.problem.pools) > 1
    for j, n in sorted((m.result.counts or {}).items()):
        w = rep.workers[j]
        pre = {"prefill": "P ", "decode": "D ", "aggregated": ""}[w.role]
        pool = f"@{rep.problem.pools[w.pool].name}" if several else ""
        parts.append(f"{pre}{n}x {w.layout.label()}{pool}")
    return " + ".join(parts)


def solve_point(sm: ServingModel, mode: str, tpot_ms: float, ttft_ms: float, budget: Budget) -> Point:
    """Solve ``mode`` at the given targets (ms) on ``sm`` (retargeted in place) within ``budget``
    and return the point."""
    from optimizer.serving import solve_instance

    sm.retarget(ttft_s=ttft_ms * 1e-3, tpot_s=tpot_ms * 1e-3)
    sm.p = replace(sm.p, mode=mode)
    rep = solve_instance(sm.p, budget, simulate_plans=False, model=sm)
    m = rep.results[0].plans[mode]
    d = rep.mode_dict(m)
    pt = Point(mode, tpot_ms, ttft_ms, d["status"])
    if not m.ok:
        c = d.get("conflict") or {}
        pt.reason = "; ".join(c.get("details", [])[:2]) if isinstance(c, dict) else str(c)
        return pt
    if m.result.status != Status.OPTIMAL:
        pt.status = m.result.status.value
        pt.reason = "not proven optimal within the time limit"
    a = d["analytic"]
    pt.objective = float(m.result.value)
    pt.gpus = int(d["gpus"])
    pt.tokens_per_s_per_gpu = float(a["tokens_per_s_per_gpu"])
    pt.tokens_per_s_per_user = float(a["tokens_per_s_per_user"]) if a["tokens_per_s_per_user"] else None
    pt.label = plan_label(rep, m)
    return pt


def pareto(p: Problem, sweep: str = "tpot", tpot_ms: list[float] | None = None, ttft_ms: list[float] | None = None,
           points: int = 20, modes: tuple[str, ...] | None = None, time_limit_s: float = 20.0,
           deadline: float | None = None) -> ParetoResult:
    """Sweep TPOT targets (``sweep='tpot'``), or TPOT x TTFT targets (``'ttft'``: one curve per TTFT
    target, default :data:`TTFT_FACTORS` times the instance's), for both modes (or ``modes``) at the
    instance's first rate; mark each curve's front. ``time_limit_s``: each solve's limit (s);
    ``deadline`` (a ``time.perf_counter()`` value, the command's budget's): after it only each
    curve's loosest target is solved, the others are counted in ``not_solved``.

    Raises:
        ValueError: ``sweep`` not ``tpot``/``ttft``, or no targets.
    """
    if sweep not in ("tpot", "ttft"):
        raise ValueError(f"sweep must be tpot or ttft (got {sweep!r})")
    t0 = time.perf_counter()
    budget = Budget(t0, time_limit_s, deadline)
    tp = sorted(tpot_ms or default_tpot_targets_ms(p, points), reverse=True)  # loosest first
    if sweep == "ttft":
        tt = list(ttft_ms or [p.ttft_s * 1e3 * f for f in TTFT_FACTORS])
    else:
        tt = [p.ttft_s * 1e3]
    if not tp or not tt:
        raise ValueError("no targets to sweep")
    modes = modes or (MODES if p.mode == "both" else (p.mode,))
    base = replace(p, rates=(p.rates[0],))
    sm = ServingModel(base)
    curves, solves, not_solved = [], 0, 0
    for ttft in tt:
        for mode in modes:
            c = Curve(mode, ttft)
            for n, tpot in enumerate(tp):
                if n and budget.expired():
                    not_solved += 1
                    continue
                c.points.append(solve_point(sm, mode, tpot, ttft, budget.within(time_limit_s)))
                solves += 1
            c.points.sort(key=lambda q: q.tpot_ms)
            mark_front(c.points)
            curves.append(c)
    res = ParetoResult(base, base.objective, base.rates[0], curves, time.perf_counter() - t0, solves, not_solved)
    if not any(c.front for c in curves):  # no front: what the instance's SLOs miss by, as a plain run says
        from optimizer.serving import best_achievable_slo

        res.achievable = best_achievable_slo(base, sm.workers(tuple(r for m in modes for r in MODE_ROLES[m])))
    return res


def write(res: ParetoResult, folder: Path) -> list[Path]:
    """``folder/pareto.json`` and ``folder/pareto.png``; returns the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    js = folder / "pareto.json"
    js.write_text(json.dumps(res.to_dict(), indent=2))
    if not any(c.front for c in res.curves):  # nothing to draw (an empty figure was written)
        return [js]
    png = folder / "pareto.png"
    plot(res, png)
    return [js, png]


def plot(res: ParetoResult, path: Path) -> None:
    """The fronts as step lines (tokens/s/user on x, tokens/s/GPU on y; between two front points the
    line holds the right-hand point's tokens/s/GPU, what a plan that fast per user achieves), each point labelled with its
    plan; dominated optimal points as faint dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=90)
    colors = {"aggregated": "tab:blue", "disaggregated": "tab:orange"}
    styles = ["-", "--", ":", "-."]
    ttfts = sorted({c.ttft_ms for c in res.curves})
    for c in res.curves:
        ls = styles[ttfts.index(c.ttft_ms) % len(styles)]
        f = c.front
        dom = [q for q in c.points if q.status == "ok" and not q.on_front]
        col = colors.get(c.mode, None)
        if dom:
            ax.scatter([q.tokens_per_s_per_user for q in dom], [q.tokens_per_s_per_gpu for q in dom], s=8, alpha=0.3,
                       color=col)
        if not f:
            continue
        lab = c.mode + (f", TTFT {c.ttft_ms:g} ms" if len(ttfts) > 1 else "")
        ax.step([q.tokens_per_s_per_user for q in f], [q.tokens_per_s_per_gpu for q in f], where="pre", ls=ls,
                marker="o", ms=4, color=col, label=lab)
        if len(ttfts) == 1 or c.ttft_ms == ttfts[len(ttfts) // 2]:
            for q in f:
                ax.annotate(q.label, (q.tokens_per_s_per_user, q.tokens_per_s_per_gpu), fontsize=6,
                            xytext=(3, 3), textcoords="offset points", color=col)
    p = res.problem
    ax.set_xlabel("tokens/s/user (1 / mean TPOT)")
    ax.set_ylabel("tokens/s/GPU")
    ax.set_title(f"{p.name}\nPareto fronts at {res.rate_rps:g} req/s, objective {res.objective} (analytic model)",
                 fontsize=9)
    ax.grid(alpha=0.3)
    import warnings

    with warnings.catch_warnings():  # an empty front draws no labelled artist: no legend, no warning
        warnings.simplefilter("ignore")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def render(res: ParetoResult, console) -> None:
    """Terminal table of each curve's front."""
    from rich.table import Table

    for c in res.curves:
        t = Table(title=f"{c.mode} front (TTFT {c.ttft_ms:g} ms, {len(c.front)} of {len(c.points)} points)")
        for h in ("TPOT target ms", "tokens/s/user", "tokens/s/GPU", "GPUs", "plan"):
            t.add_column(h)
        for q in c.front:
            t.add_row(f"{q.tpot_ms:.1f}", f"{q.tokens_per_s_per_user:.1f}", f"{q.tokens_per_s_per_gpu:.1f}",
                      str(q.gpus), q.label)
        console.print(t)
    console.print(f"{res.solves} solves in {res.time_s:.1f} s")
    if not any(c.front for c in res.curves):
        console.print("[red]No target gives a plan: no front (pareto.png not written).[/red]")
        if res.achievable:
            console.print(f"[bold]best achievable[/bold]: {res.achievable['detail']}")
    if res.not_solved:
        console.print(f"[yellow]cut short by the time limit: {res.not_solved} targets not solved[/yellow]")
