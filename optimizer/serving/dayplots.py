"""Day-plan figure ``schedule.png`` (``--plot DIR`` through :mod:`optimizer.serving.plots`, or
``--output DIR``).

Two panels over the windows of the chosen mode's plan:

* GPUs up per window, stacked by configuration, with the static plan's GPUs (sized for the peak
  window) as a dashed line;
* each window's rate (req/s) and its simulated attainment against the target.

Data are read from the report only through its result envelope (:func:`schedule_data`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from optimizer.plots import one_figure


@dataclass
class ScheduleData:
    title: str
    mode: str
    starts_min: list[float]
    lengths_min: list[float]
    gpus_by_config: dict[str, list[int]]
    static_gpus: Optional[int]
    rates: list[float]
    attainment: list[Optional[float]]
    target: float
    gpu_hours: float
    static_gpu_hours: Optional[float]


def schedule_data(report) -> Optional[ScheduleData]:
    """The figure's data from the envelope; None without an accepted plan."""
    d = report.to_dict()
    plan = d.get("plan") or {}
    if not plan.get("best_mode"):
        return None
    m = plan["modes"][plan["best_mode"]]
    gpus_of = {c["label"]: c["gpus"] for c in m["configurations"]}
    configs = sorted({lab for w in m["windows"] for lab in w["workers"]})
    by = {lab: [w["workers"].get(lab, 0) * gpus_of[lab] for w in m["windows"]] for lab in configs}
    st = m.get("static") or {}
    return ScheduleData(d["name"], plan["best_mode"], [w["start_min"] for w in m["windows"]],
                        [w["length_min"] for w in m["windows"]], by, st.get("gpus"),
                        [w["rate_rps"] for w in m["windows"]], [w["attainment"] for w in m["windows"]],
                        plan["slo"]["attainment"], m["gpu_hours"], st.get("gpu_hours"))


def write(report, folder: Path) -> list[Path]:
    """Write ``schedule.png`` into ``folder``.

    Raises:
        NoPlot: no accepted day plan.
    """
    return one_figure(schedule_data(report), _figure, folder / "schedule.png",
                      f"serving day plan: no plan ({report.status.value}), no schedule plot")


def _figure(d: ScheduleData):
    import numpy as np

    from optimizer.plots import figure

    fig = figure(10, 6)
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    x = np.array(d.starts_min)
    width = np.array(d.lengths_min)
    bottom = np.zeros(len(x))
    for lab, vals in d.gpus_by_config.items():
        ax1.bar(x, vals, width=width, bottom=bottom, align="edge", label=lab, edgecolor="white")
        bottom += np.array(vals, dtype=float)
    if d.static_gpus is not None:
        ax1.axhline(d.static_gpus, color="grey", linestyle="--",
                    label=f"static plan ({d.static_gpus} GPUs, {d.static_gpu_hours:.2f} GPU-h)")
    ax1.set_ylabel("GPUs up")
    ax1.set_title(f"{d.mode} day plan: {d.gpu_hours:.2f} GPU-hours")
    ax1.legend(fontsize=7)
    ax2.step(np.append(x, x[-1] + width[-1]), np.append(d.rates, d.rates[-1]), where="post", color="#4c72b0")
    ax2.set_ylabel("rate (req/s)", color="#4c72b0")
    ax2.set_xlabel("time (min)")
    ax3 = ax2.twinx()
    att = [a if a is not None else np.nan for a in d.attainment]
    ax3.plot(x + width / 2, att, "o", color="#55a868", label="simulated attainment")
    ax3.axhline(d.target, color="red", linestyle="--", linewidth=1, label=f"target {d.target:g}")
    ax3.set_ylim(min(d.target - 0.05, np.nanmin(att) - 0.02) if not np.all(np.isnan(att)) else 0, 1.005)
    ax3.set_ylabel("attainment")
    ax3.legend(fontsize=7, loc="lower right")
    fig.suptitle(d.title, fontsize=10)
    return fig
