"""Expert-placement figure (``--plot DIR``, dispatched by :func:`optimizer.plots.write_plots`).

``expert_load.png``: GPU loads of the greedy EPLB baseline and of the optimised plan, the least
balanced layer's per-GPU bars and the load/mean heat map of every layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from optimizer.plots import WEIGHTS, figure, one_figure


def write(report, folder: Path) -> list[Path]:
    """Write ``expert_load.png`` into ``folder``.

    Raises:
        NoPlot: the report has no placement.
    """
    return one_figure(expert_load_data(report), _expert_figure, folder / "expert_load.png",
                      f"experts: no placement ({report.status.value}), no load plot")


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
    m = report.data
    tr, win, slots = m.trace, m.windows, m.slots
    fit = tr.loads[list(win.fit)].sum(axis=0)
    p2l, policy = greedy_plans(fit, slots, m.num_groups, m.num_nodes)
    greedy, opt = [], []
    for r in report.rows:
        g = plan_from_phy2log(p2l[r.layer], tr.num_experts, slots).loads(fit[r.layer])
        if not np.isclose(g.max(), r.greedy.max_load, rtol=1e-9, atol=1e-6):
            raise RuntimeError(f"layer {r.name}: rebuilt greedy max load {g.max()} != report {r.greedy.max_load}")
        greedy.append(g)
        opt.append(r.outcome.plan.loads(fit[r.layer]))
    return ExpertLoadData(m.name or "experts", [r.name for r in report.rows], np.array(greedy), np.array(opt), policy)


def _expert_figure(d: ExpertLoadData):
    L, G = d.greedy.shape
    worst = int(np.argmax(d.greedy.max(axis=1) / np.maximum(d.greedy.mean(axis=1), 1e-12)))
    fig = figure(max(8.0, 0.3 * G + 2), 4.0 + min(6.0, 0.12 * L + 1.5))
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
