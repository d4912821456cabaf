"""Deployment figures (``--plot DIR``, dispatched by :func:`optimizer.plots.write_plots`).

* ``timeline.png``: sessions per instance over time as a Gantt chart, from the independent
  evaluator's timeline; deadline marks; with faults a second panel for the worst fault scenario
  with its stall window;
* ``memory.png``: bytes per GPU stacked by weights, KV cache and reserve (eq. 6-1) against the
  GPU's HBM.

Data are read from the report only through the ``*_data`` accessors below.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from optimizer.plots import KV, LATE, ON_TIME, RESERVE, WEIGHTS, NoPlot, figure, save
from optimizer.deployment.report import _ranges


TIMELINE_MAX_ROWS = 64  # instances drawn in timeline.png (the title says when there are more)
TIMELINE_MAX_LABELS = 100  # sessions named on their bars, only when there are at most this many


def write(report, folder: Path) -> list[Path]:
    """Write ``timeline.png`` and ``memory.png`` into ``folder``.

    Raises:
        NoPlot: the report has no evaluated plan.
    """
    tl = deployment_timeline_data(report)
    if tl is None:
        raise NoPlot(f"deployment: no plan ({report.status.value}), no timeline or memory plot")
    return [save(_timeline_figure(tl), folder / "timeline.png"),
            save(_memory_figure(deployment_memory_data(report)), folder / "memory.png")]


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
    rows = [f"{i.id} {i.lay.label()} GPU {_ranges(i.gpus)}" for i in insts]
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
    """Bytes on the fullest GPU of each instance split as in eq. 6-1: the layout's weights per GPU
    (:meth:`optimizer.model.perf.PerfModel.weight_bytes_per_gpu`), the reserve, and the KV cache
    (the rest of the evaluator's memory per GPU), in GB.

    Raises:
        RuntimeError: the split does not add up to the evaluator's memory per GPU (a bug).
    """
    from optimizer.deployment.perf import PerfModel

    p = report.problem
    ev = report.outcome.evaluation
    perf = PerfModel(p)
    n = p.total_gpus
    w, kv, res = np.zeros(n), np.zeros(n), np.zeros(n)
    owner: list[Optional[str]] = [None] * n
    for inst in ev.plan.instances:
        # the fullest GPU of the instance (worst PP stage, busiest attention-DP rank): weights of
        # the layout, the reserve, and the KV cache is the rest of the evaluator's total
        weights = perf.model.weight_bytes_per_gpu(inst.lay)
        total = ev.memory_per_gpu[inst.id]
        cache = total - weights - p.reserve_bytes
        if cache < -1e-6 * max(total, 1.0):
            raise RuntimeError(f"{inst.id}: weights {weights} + reserve exceed the evaluator's {total} bytes per GPU")
        for g in inst.gpus:
            w[g], kv[g], res[g], owner[g] = weights / 1e9, cache / 1e9, p.reserve_bytes / 1e9, inst.id
    return MemoryData(p.name, list(range(n)), owner, w, kv, res, p.gpu.memory_bytes / 1e9)


def _timeline_figure(d: TimelineData):
    from matplotlib.patches import Patch

    total = len(d.panels[0].rows)
    rows = min(total, TIMELINE_MAX_ROWS)
    span = max((b.finish_ms for pn in d.panels for bs in pn.bars.values() for b in bs), default=1.0)
    fig = figure(10, 1.2 + len(d.panels) * (0.9 + 0.45 * rows))
    axes = fig.subplots(len(d.panels), 1, squeeze=False, sharex=True)[:, 0]
    for ax, pn in zip(axes, d.panels):
        shown = [(rows - 1 - r, b) for r, bars in pn.bars.items() if r < rows for b in bars]
        if shown:  # one call for every bar and one for every deadline mark (3,000 sessions: 7 s -> well under 1 s)
            by_row: dict[int, list[Bar]] = {}
            for y, b in shown:
                by_row.setdefault(y, []).append(b)
            for y, bs in by_row.items():  # one collection per instance, not a patch per session
                bs = sorted(bs, key=lambda b: b.on_time, reverse=True)  # late ones on top of the batch they share
                ax.broken_barh([(b.start_ms, b.finish_ms - b.start_ms) for b in bs], (y - 0.3, 0.6),
                               facecolors=[ON_TIME if b.on_time else LATE for b in bs], edgecolor="black", linewidth=0.5)
            marks = [(y, b.deadline_ms) for y, b in shown if b.deadline_ms is not None]
            if marks:
                ax.vlines([m for _, m in marks], [y - 0.4 for y, _ in marks], [y + 0.4 for y, _ in marks],
                          color="black", linewidth=1.2)
            if rows <= 24 and len(shown) <= TIMELINE_MAX_LABELS:  # (3,000 labels overlapped and took seconds)
                for y, b in shown:
                    if b.finish_ms - b.start_ms >= 0.06 * span:  # label bars wide enough
                        ax.text((b.start_ms + b.finish_ms) / 2, y, b.session, ha="center", va="center", fontsize=7,
                                clip_on=True)
        for r, a, e in pn.stalls:
            if r >= rows:
                continue
            y = rows - 1 - r
            ax.axvspan(a, e, ymin=(y + 0.05) / rows, ymax=(y + 0.95) / rows, color=LATE, alpha=0.25, hatch="//")
        ax.set_yticks(range(rows))
        ax.set_yticklabels(list(reversed(pn.rows[:rows])), fontsize=8)
        ax.set_ylim(-0.6, rows - 0.4)
        ax.set_title(pn.title + (f" (first {rows} of {total} instances)" if rows < total else ""), fontsize=9)
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
    fig = figure(min(24.0, max(6.0, 0.35 * n + 2)), 4.2)  # 32,768 GPUs asked for an 11,000-inch figure
    ax = fig.subplots()
    x = np.arange(n)
    ax.bar(x, d.weights_gb, color=WEIGHTS, label="weights")
    ax.bar(x, d.kv_gb, bottom=d.weights_gb, color=KV, label="KV cache")
    ax.bar(x, d.reserve_gb, bottom=d.weights_gb + d.kv_gb, color=RESERVE, label="reserve")
    ax.axhline(d.capacity_gb, color="black", linestyle="--", linewidth=1, label=f"HBM {d.capacity_gb:g} GB")
    step = max(1, -(-n // 64))  # at most 64 tick labels
    labels = [f"{g}\n{d.instance[g] or 'idle'}" if n <= 32 else str(g) for g in d.gpus][::step]
    ax.set_xticks(x[::step])
    ax.set_xticklabels(labels, fontsize=7 if n <= 16 else 5)
    ax.set_xlabel("GPU (instance)")
    ax.set_ylabel("memory per GPU (GB)")
    ax.set_ylim(0, d.capacity_gb * 1.12)
    ax.legend(fontsize=8, loc="upper left", ncols=4)
    ax.set_title(f"{d.name}\nmemory per GPU by weights, KV cache and reserve (eq. 6-1)", fontsize=9)
    return fig
