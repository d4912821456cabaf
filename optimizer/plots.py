"""PNG figures of a result: ``optimize INSTANCE.yaml --plot DIR``.

One entry point, :func:`write_plots`, takes the report a problem's ``run(...)`` returned and
writes the figures that make sense for it:

* deployment: ``timeline.png`` (sessions per instance over time as a Gantt chart, from the
  independent evaluator's timeline; deadline marks; with faults a second panel for the worst
  fault scenario with its stall window) and ``memory.png`` (bytes per GPU stacked by weights,
  KV cache and reserve, eq. 6-1, against the GPU's HBM);
* experts: ``expert_load.png`` (GPU loads of the greedy EPLB baseline and of the optimised
  plan: the least balanced layer's per-GPU bars and the load/mean heat map of every layer);
* buildout: ``racks.png`` (racks drawn as columns of rack units filled by server type,
  outlined by cooling, with the switch chip counts).

Data are read from the reports through the ``*_data`` accessor functions below (the only
place that knows the report objects' attributes). Figures use matplotlib's object API with
the Agg canvas (no display, no global pyplot state).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

DPI = 110
ON_TIME = "#4c9f70"
LATE = "#d1495b"
WEIGHTS, KV, RESERVE = "#386fa4", "#f4a259", "#9e9e9e"


@dataclass
class PlotResult:
    """What :func:`write_plots` did: files written (in order) and why others were not."""

    files: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def write_plots(report: Any, folder: Path) -> PlotResult:
    """Write the figures for ``report`` into ``folder`` (created when missing).

    Args:
        report: a ``DeploymentReport``, ``ExpertsReport`` or ``BuildoutReport``.
        folder: output folder.
    Returns:
        PlotResult; an infeasible or time-limited result without a plan writes nothing and
        says so in ``skipped``.
    Raises:
        OSError: the folder cannot be created or written.
        TypeError: an unknown report type.
    """
    kind = report_kind(report)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = PlotResult()
    if kind == "deployment":
        tl = deployment_timeline_data(report)
        if tl is None:
            out.skipped.append(f"deployment: no plan ({report.status.value}), no timeline or memory plot")
            return out
        out.files.append(_save(_timeline_figure(tl), folder / "timeline.png"))
        out.files.append(_save(_memory_figure(deployment_memory_data(report)), folder / "memory.png"))
    elif kind == "experts":
        ld = expert_load_data(report)
        if ld is None:
            out.skipped.append(f"experts: no placement ({report.status.value}), no load plot")
            return out
        out.files.append(_save(_expert_figure(ld), folder / "expert_load.png"))
    else:
        lay = buildout_layout_data(report)
        if lay is None:
            out.skipped.append(f"buildout: no plan ({report.status.value}), no rack layout plot")
            return out
        out.files.append(_save(_racks_figure(lay), folder / "racks.png"))
    return out


def report_kind(report: Any) -> str:
    """``deployment``, ``experts`` or ``buildout``.

    Raises:
        TypeError: not one of the three report classes.
    """
    from optimizer.buildout.report import BuildoutReport
    from optimizer.deployment.report import DeploymentReport
    from optimizer.experts.report import ExpertsReport

    for cls, name in ((DeploymentReport, "deployment"), (ExpertsReport, "experts"), (BuildoutReport, "buildout")):
        if isinstance(report, cls):
            return name
    raise TypeError(f"no plots for {type(report).__name__}")


# ============================================================================ accessors
@dataclass
class Bar:
    session: str
    start_ms: float
    finish_ms: float
    deadline_ms: Optional[float]
    on_time: bool


@dataclass
class TimelinePanel:
    title: str
    rows: list[str]                         # one label per instance, top to bottom
    bars: dict[int, list[Bar]]              # row index -> sessions
    stalls: list[tuple[int, float, float]]  # (row, start ms, end ms) of a fault's stall


@dataclass
class TimelineData:
    name: str
    panels: list[TimelinePanel]


def deployment_timeline_data(report) -> Optional[TimelineData]:
    """The evaluator's timeline: nominal run, plus the worst fault scenario when there are faults.

    Returns None when the report has no evaluated plan.
    """
    ev = report.outcome.evaluation
    if ev is None or not ev.plan.instances or ev.violations:
        return None
    insts = ev.plan.instances
    rows = [f"{i.id} TP{i.degree} GPU {_ranges(i.gpus)}" for i in insts]
    index = {i.id: k for k, i in enumerate(insts)}

    def panel(title, scenario, stalls):
        bars: dict[int, list[Bar]] = {k: [] for k in range(len(insts))}
        for t in scenario.sessions:
            bars[index[t.instance]].append(Bar(t.id, t.start_s * 1e3, t.finish_s * 1e3,
                                               None if t.deadline_s is None else t.deadline_s * 1e3, t.on_time))
        return TimelinePanel(title, rows, bars, stalls)

    n = len(report.problem.sessions)
    panels = [panel(f"nominal: makespan {ev.nominal.makespan_s * 1e3:.2f} ms, {ev.nominal.on_time} of {n} on time",
                    ev.nominal, [])]
    if ev.scenarios:
        try:
            w = ev.worst_by(report.outcome.objective)
        except KeyError:  # an objective the evaluator ranks no scenarios by: the costliest one
            w = ev.worst
        stalls = []
        if w.fault is not None and w.gpu is not None:
            for k, i in enumerate(insts):
                if w.gpu in i.gpus:
                    stalls.append((k, w.fault.at_s * 1e3, (w.fault.at_s + w.fault.stall_s) * 1e3))
        panels.append(panel(f"worst fault scenario ({w.label}): makespan {w.makespan_s * 1e3:.2f} ms, "
                            f"{w.on_time} of {n} on time", w, stalls))
    return TimelineData(report.problem.name, panels)


@dataclass
class MemoryData:
    name: str
    gpus: list[int]                 # global GPU ids, x axis
    instance: list[Optional[str]]   # instance id per GPU (None: idle)
    weights_gb: np.ndarray          # per GPU, GB (1e9 bytes)
    kv_gb: np.ndarray
    reserve_gb: np.ndarray
    capacity_gb: float


def deployment_memory_data(report) -> MemoryData:
    """Bytes per GPU split as in eq. 6-1: ``(resident - norms)/p + norms`` weights,
    ``sum kv_token·(context+new)/min(p, KVH)`` KV cache and the reserve, in GB.

    Raises:
        RuntimeError: the split does not add up to the evaluator's memory per GPU (a bug).
    """
    from optimizer.deployment.perf import PerfModel

    p = report.problem
    ev = report.outcome.evaluation
    perf = PerfModel(p)
    by_id = {s.id: s for s in p.sessions}
    n = p.total_gpus
    w, kv, res = np.zeros(n), np.zeros(n), np.zeros(n)
    owner: list[Optional[str]] = [None] * n
    for inst in ev.plan.instances:
        weights = perf.static_bytes_per_gpu(inst.degree) - p.reserve_bytes
        cache = sum(perf.kv_bytes_per_gpu(inst.degree, by_id[s].context, by_id[s].new) for s in inst.sessions)
        total = ev.memory_per_gpu[inst.id]
        if abs(weights + cache + p.reserve_bytes - total) > 1e-9 * max(total, 1.0):
            raise RuntimeError(f"{inst.id}: memory split {weights + cache + p.reserve_bytes} != evaluator {total}")
        for g in inst.gpus:
            w[g], kv[g], res[g], owner[g] = weights / 1e9, cache / 1e9, p.reserve_bytes / 1e9, inst.id
    return MemoryData(p.name, list(range(n)), owner, w, kv, res, p.gpu.memory_bytes / 1e9)


@dataclass
class ExpertLoadData:
    name: str
    layers: list[str]
    greedy: np.ndarray      # [layers, gpus] tokens on the fitted windows
    optimized: np.ndarray   # [layers, gpus]
    greedy_policy: str


def expert_load_data(report) -> Optional[ExpertLoadData]:
    """GPU loads (tokens) of the greedy EPLB baseline and of the optimised plan per layer.

    The optimised plan is each row's ``outcome.plan``; the greedy plan is rebuilt from the
    report's trace and fitted windows with the same EPLB call the problem uses, and checked
    against the report's greedy max load.

    Raises:
        RuntimeError: the rebuilt greedy loads disagree with the report (a bug).
    """
    from optimizer.experts.plan import plan_from_phy2log
    from optimizer.experts.problem import greedy_plans

    if not report.rows:
        return None
    m = report.meta
    tr, win, slots = m["trace"], m["windows"], m["slots"]
    fit = tr.loads[list(win.fit)].sum(axis=0)
    p2l, policy = greedy_plans(fit, slots, m["num_groups"], m["num_nodes"])
    greedy, opt = [], []
    for r in report.rows:
        g = plan_from_phy2log(p2l[r.layer], tr.num_experts, slots).loads(fit[r.layer])
        if not np.isclose(g.max(), r.greedy.max_load, rtol=1e-9, atol=1e-6):
            raise RuntimeError(f"layer {r.name}: rebuilt greedy max load {g.max()} != report {r.greedy.max_load}")
        greedy.append(g)
        opt.append(r.outcome.plan.loads(fit[r.layer]))
    return ExpertLoadData(m["name"] or "experts", [r.name for r in report.rows], np.array(greedy), np.array(opt), policy)


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


# ============================================================================ figures
def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=DPI, layout="constrained")


def _save(fig, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path, format="png")
    return path


def _timeline_figure(d: TimelineData):
    from matplotlib.patches import Patch

    rows = len(d.panels[0].rows)
    span = max((b.finish_ms for pn in d.panels for bs in pn.bars.values() for b in bs), default=1.0)
    fig = _figure(10, 1.2 + len(d.panels) * (0.9 + 0.45 * rows))
    axes = fig.subplots(len(d.panels), 1, squeeze=False, sharex=True)[:, 0]
    for ax, pn in zip(axes, d.panels):
        for r, bars in pn.bars.items():
            y = rows - 1 - r
            for b in bars:
                ax.barh(y, b.finish_ms - b.start_ms, left=b.start_ms, height=0.6,
                        color=ON_TIME if b.on_time else LATE, edgecolor="black", linewidth=0.5)
                if rows <= 24 and b.finish_ms - b.start_ms >= 0.06 * span:  # label bars wide enough
                    ax.text((b.start_ms + b.finish_ms) / 2, y, b.session, ha="center", va="center", fontsize=7,
                            clip_on=True)
                if b.deadline_ms is not None:
                    ax.plot([b.deadline_ms] * 2, [y - 0.4, y + 0.4], color="black", linewidth=1.2)
        for r, a, e in pn.stalls:
            y = rows - 1 - r
            ax.axvspan(a, e, ymin=(y + 0.05) / rows, ymax=(y + 0.95) / rows, color=LATE, alpha=0.25, hatch="//")
        ax.set_yticks(range(rows))
        ax.set_yticklabels(list(reversed(pn.rows)), fontsize=8)
        ax.set_ylim(-0.6, rows - 0.4)
        ax.set_title(pn.title, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("time (ms)")
    handles = [Patch(color=ON_TIME, label="on time"), Patch(color=LATE, label="late"),
               Patch(facecolor="white", edgecolor="black", label="| deadline")]
    if any(pn.stalls for pn in d.panels):
        handles.append(Patch(color=LATE, alpha=0.25, hatch="//", label="fault stall"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)
    fig.suptitle(d.name, fontsize=10)
    return fig


def _memory_figure(d: MemoryData):
    n = len(d.gpus)
    fig = _figure(max(6.0, 0.35 * n + 2), 4.2)
    ax = fig.subplots()
    x = np.arange(n)
    ax.bar(x, d.weights_gb, color=WEIGHTS, label="weights")
    ax.bar(x, d.kv_gb, bottom=d.weights_gb, color=KV, label="KV cache")
    ax.bar(x, d.reserve_gb, bottom=d.weights_gb + d.kv_gb, color=RESERVE, label="reserve")
    ax.axhline(d.capacity_gb, color="black", linestyle="--", linewidth=1, label=f"HBM {d.capacity_gb:g} GB")
    labels = [f"{g}\n{d.instance[g] or 'idle'}" if n <= 32 else str(g) for g in d.gpus]
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=7 if n <= 16 else 5)
    ax.set_xlabel("GPU (instance)")
    ax.set_ylabel("memory per GPU (GB)")
    ax.set_ylim(0, d.capacity_gb * 1.12)
    ax.legend(fontsize=8, loc="upper left", ncols=4)
    ax.set_title(f"{d.name}\nmemory per GPU by weights, KV cache and reserve (eq. 6-1)", fontsize=9)
    return fig


def _expert_figure(d: ExpertLoadData):
    L, G = d.greedy.shape
    worst = int(np.argmax(d.greedy.max(axis=1) / np.maximum(d.greedy.mean(axis=1), 1e-12)))
    fig = _figure(max(8.0, 0.3 * G + 2), 4.0 + min(6.0, 0.12 * L + 1.5))
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.0, 1.2])
    ax = top.subplots()
    x = np.arange(G)
    ax.bar(x - 0.2, d.greedy[worst], width=0.4, color="#9e9e9e", label=f"greedy EPLB ({d.greedy_policy})")
    ax.bar(x + 0.2, d.optimized[worst], width=0.4, color=WEIGHTS, label="optimised")
    ax.axhline(d.greedy[worst].mean(), color="black", linestyle="--", linewidth=1, label="mean")
    ax.set_xlabel("GPU")
    ax.set_ylabel("tokens")
    ax.set_title(f"layer {d.layers[worst]} (least balanced under greedy): max load greedy "
                 f"{d.greedy[worst].max():.0f}, optimised {d.optimized[worst].max():.0f}", fontsize=9)
    ax.legend(fontsize=8)
    axs = bottom.subplots(1, 2, sharey=True)
    rel_g = d.greedy / np.maximum(d.greedy.mean(axis=1, keepdims=True), 1e-12)
    rel_o = d.optimized / np.maximum(d.optimized.mean(axis=1, keepdims=True), 1e-12)
    vmin, vmax = float(min(rel_g.min(), rel_o.min())), float(max(rel_g.max(), rel_o.max()))
    for a, rel, t in ((axs[0], rel_g, "greedy"), (axs[1], rel_o, "optimised")):
        im = a.imshow(rel, aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax, interpolation="nearest")
        a.set_title(f"{t}: GPU load / layer mean (max {rel.max():.3f})", fontsize=9)
        a.set_xlabel("GPU")
    axs[0].set_ylabel("layer")
    if L <= 30:
        axs[0].set_yticks(range(L))
        axs[0].set_yticklabels(d.layers, fontsize=7)
    bottom.colorbar(im, ax=list(axs), shrink=0.9)
    fig.suptitle(d.name, fontsize=10)
    return fig


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
    fig = _figure(max(6.0, 0.75 * len(racks) + 2.5), 5.5)
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
