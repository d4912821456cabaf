"""Build-out figure (``--plot DIR``, dispatched by :func:`optimizer.plots.write_plots`).

``racks.png``: racks drawn as columns of rack units filled by server type, outlined by cooling,
with the switch chip counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from optimizer.plots import figure, one_figure


def write(report, folder: Path) -> list[Path]:
    """Write ``racks.png`` into ``folder``.

    Raises:
        NoPlot: the report has no plan.
    """
    return one_figure(buildout_layout_data(report), _racks_figure, folder / "racks.png",
                      f"buildout: no plan ({report.status.value}), no rack layout plot")


@dataclass
class RackGroup:
    cooling: str                  # air | liquid
    count: int                    # identical racks
    servers: dict[str, int]       # type -> servers per rack
    power_kw: float


@dataclass
class BuildoutLayoutData:
    name: str
    rack_units: int
    limit_kw: dict[str, Optional[float]]   # per-rack power limit by cooling
    units_of: dict[str, int]               # rack units per server type
    groups: list[RackGroup]
    leaf: int
    spine: int
    power_kw: float
    budget_kw: float
    gpus: int


def buildout_layout_data(report) -> Optional[BuildoutLayoutData]:
    """Racks of the plan (from ``report.plan_dict()``) with the rack limits; None without a plan."""
    plan = report.plan_dict()
    if plan is None:
        return None
    p = report.problem
    groups = [RackGroup(g["cooling"], int(g["count"]), dict(g["servers"]), float(g["power_kw"]))
              for g in plan["rack_layout"]]
    return BuildoutLayoutData(p.name, p.rack_units, {"air": p.air_cooled_kw, "liquid": p.liquid_cooled_kw},
                              {t.name: t.rack_units for t in p.types}, groups,
                              int(plan["switches"]["leaf"]), int(plan["switches"]["spine"]),
                              float(plan["power_kw"]), float(plan["power_budget_kw"]), int(plan["gpus"]))


MAX_RACKS_DRAWN = 40


def _racks_figure(d: BuildoutLayoutData):
    from matplotlib import colormaps
    from matplotlib.patches import Patch, Rectangle

    total = sum(g.count for g in d.groups)
    # individual racks when few, otherwise one rack per distinct layout with its count
    if total <= MAX_RACKS_DRAWN:
        racks = [(g, None) for g in d.groups for _ in range(g.count)]
    else:
        racks = [(g, g.count) for g in d.groups]
    types = sorted(d.units_of)
    cmap = colormaps["tab10"]
    colour = {t: cmap(i % 10) for i, t in enumerate(types)}
    edge = {"air": "#1f77b4", "liquid": "#17becf"}
    fig = figure(max(6.0, 0.75 * len(racks) + 2.5), 5.5)
    ax = fig.subplots()
    for k, (g, count) in enumerate(racks):
        ax.add_patch(Rectangle((k, 0), 0.8, d.rack_units, facecolor="white", edgecolor=edge[g.cooling], linewidth=2.5))
        u = 0
        for t in sorted(g.servers):
            for _ in range(g.servers[t]):
                h = d.units_of[t]
                ax.add_patch(Rectangle((k + 0.06, u + 0.15), 0.68, h - 0.3, facecolor=colour[t], edgecolor="black",
                                       linewidth=0.4))
                u += h
        lim = d.limit_kw.get(g.cooling)
        label = f"{g.cooling}\n{g.power_kw:g}" + (f"/{lim:g}" if lim else "") + " kW"
        if count is not None:
            label = f"x{count}\n" + label
        ax.text(k + 0.4, -1, label, ha="center", va="top", fontsize=7)
    ax.set_xlim(-0.3, len(racks) + 0.1)
    ax.set_ylim(-9, d.rack_units + 1)
    ax.set_xticks([])
    ax.set_ylabel("rack units (U)")
    handles = [Patch(color=colour[t], label=t) for t in types if any(t in g.servers for g in d.groups)]
    handles += [Patch(facecolor="white", edgecolor=edge[c], linewidth=2.5, label=f"{c}-cooled rack")
                for c in ("air", "liquid") if any(g.cooling == c for g in d.groups)]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    drawn = "each rack" if total <= MAX_RACKS_DRAWN else "one rack per layout (xN identical racks)"
    ax.set_title(f"{d.name}\n{total} racks ({drawn}), {d.gpus} GPUs, {d.power_kw:g} of {d.budget_kw:g} kW;\n"
                 f"switch chips: {d.leaf} leaf, {d.spine} spine", fontsize=9)
    return fig
