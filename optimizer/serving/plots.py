"""Serving figure (``--plot DIR``, dispatched by :func:`optimizer.plots.write_plots`).

``serving_plan.png``, two panels per rate of the instance (first rate shown when there are several):

* GPUs of each mode's plan, stacked by worker role (aggregated, prefill, decode), with the
  chosen mode highlighted and a mode without a plan marked with a cross;
* the SLO figures of each mode's plan: TTFT and TPOT at the checked quantile, analytic (the
  model the MILP used) beside simulated (SimPy re-check, p90), against the targets.

Data are read from the report only through :func:`serving_plan_data` (the result envelope).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from optimizer.plots import CHOSEN, figure, one_figure

ROLE_COLOURS = {"aggregated": "#4c72b0", "prefill": "#dd8452", "decode": "#55a868"}


@dataclass
class ModePlan:
    mode: str
    ok: bool
    gpus_by_role: dict[str, int] = field(default_factory=dict)
    ttft_ms: tuple[Optional[float], Optional[float]] = (None, None)  # analytic, simulated
    tpot_ms: tuple[Optional[float], Optional[float]] = (None, None)
    reason: str = ""


@dataclass
class ServingPlanData:
    title: str
    rate_rps: float
    best_mode: Optional[str]
    modes: list[ModePlan]
    ttft_target_ms: float
    tpot_target_ms: float


def serving_plan_data(report) -> Optional[ServingPlanData]:
    """The figure's data from the report's envelope; None when no mode has a plan."""
    d = report.to_dict()
    plan = d.get("plan")
    if not plan or not plan.get("rates"):
        return None
    r = plan["rates"][0]
    modes = []
    for name, m in r["modes"].items():
        if m.get("status") != "ok":
            modes.append(ModePlan(name, False, reason=str(m.get("status"))))
            continue
        roles: dict[str, int] = {}
        for w in m["workers"]:
            roles[w["role"]] = roles.get(w["role"], 0) + w["gpus"]
        an, sim = m.get("analytic") or {}, m.get("simulated") or {}
        modes.append(ModePlan(name, True, roles,
                              (an.get("ttft_ms"), (sim.get("ttft_ms") or {}).get("p90")),
                              (an.get("tpot_ms"), (sim.get("tpot_ms") or {}).get("p90"))))
    if not any(m.ok for m in modes):
        return None
    slo = plan["slo"]
    return ServingPlanData(d["name"], r["rate_rps"], r.get("best_mode"), modes, slo["ttft_ms"], slo["tpot_ms"])


def write(report, folder: Path) -> list[Path]:
    """Write ``serving_plan.png`` into ``folder`` (a day plan: ``schedule.png``, :mod:`.dayplots`).

    Raises:
        NoPlot: no mode has a plan (infeasible).
    """
    if (report.to_dict().get("plan") or {}).get("kind") == "day_plan":
        from optimizer.serving import dayplots

        return dayplots.write(report, folder)
    return one_figure(serving_plan_data(report), _figure, folder / "serving_plan.png",
                      f"serving: no plan ({report.status.value}), no plan plot")


def _figure(d: ServingPlanData):
    import numpy as np

    fig = figure(11, 4.2)
    ax1, ax2 = fig.subplots(1, 2)
    names = [m.mode for m in d.modes]
    x = np.arange(len(names))
    bottom = np.zeros(len(names))
    for role, colour in ROLE_COLOURS.items():
        vals = np.array([m.gpus_by_role.get(role, 0) for m in d.modes], dtype=float)
        if vals.any():
            ax1.bar(x, vals, bottom=bottom, color=colour, label=role)
            bottom += vals
    for i, m in enumerate(d.modes):
        if not m.ok:
            ax1.plot([i], [0], marker="x", color="grey", markersize=12)
        elif m.mode == d.best_mode:
            ax1.bar([i], [bottom[i]], fill=False, edgecolor=CHOSEN, linewidth=2.5)
    ax1.set_xticks(x, [n + (" (chosen)" if n == d.best_mode else "") for n in names])
    ax1.set_ylabel("GPUs")
    ax1.set_title(f"GPUs per mode at {d.rate_rps:g} req/s")
    ax1.legend(fontsize=8)
    width = 0.2
    for k, (label, pick, target) in enumerate((("TTFT", lambda m: m.ttft_ms, d.ttft_target_ms),
                                               ("TPOT", lambda m: m.tpot_ms, d.tpot_target_ms))):
        an = [(pick(m)[0] or 0) / target if m.ok else 0 for m in d.modes]
        sim = [(pick(m)[1] or 0) / target if m.ok else 0 for m in d.modes]
        ax2.bar(x + (2 * k - 1.5) * width, an, width, label=f"{label} analytic", alpha=0.6)
        ax2.bar(x + (2 * k - 0.5) * width, sim, width, label=f"{label} simulated p90")
    ax2.axhline(1.0, color="red", linestyle="--", linewidth=1, label="SLO target")
    ax2.set_xticks(x, names)
    ax2.set_ylabel("fraction of the SLO target")
    ax2.set_title(f"TTFT (target {d.ttft_target_ms:g} ms), TPOT (target {d.tpot_target_ms:g} ms)")
    ax2.legend(fontsize=7)
    fig.suptitle(d.title, fontsize=10)
    return fig
