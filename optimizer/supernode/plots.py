"""Supernode figure (``--plot DIR``, dispatched by :func:`optimizer.plots.write_plots`).

``supernode_options.png``, three panels:

* sessions per card N of every option (size S, fabric, a tier per table, KV tier), the chosen
  options highlighted, options that cannot be built marked with a cross at 0;
* decode tokens/s per card (N / step) of every option, same layout;
* memory per card of the plan's options and, for comparison, of the best option of every other
  size and fabric (the report's alternatives), in options order: replicated weights, routed experts / S, tables
  in HBM with their projections / S (eq 6-14), N x KV per session (KV in HBM), reserve U,
  against the card's HBM capacity (eq 6-1).

Data are read from the report only through :func:`supernode_options_data`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from optimizer.plots import CHOSEN, KV, RESERVE, WEIGHTS, figure, one_figure

EXPERTS, TABLES = "#7aa6c2", "#8e6c8a"
MAX_LABELLED = 24   # options with one tick label each; more are labelled per size group


def write(report, folder: Path) -> list[Path]:
    """Write ``supernode_options.png`` into ``folder``.

    Raises:
        NoPlot: the report has no plan (infeasible, or the time limit ran out first).
    """
    return one_figure(supernode_options_data(report), _options_figure, folder / "supernode_options.png",
                      f"supernode: no plan ({report.status.value}), no options plot")


@dataclass
class OptionPoint:
    """One option of the instance (``perf.options`` order)."""

    label: str                  # Option.label, e.g. "S=64 NVLink, tables hbm,hbm, KV hbm"
    size: int                   # S, cards per instance
    fabric: str                 # NVLink | NIC
    tables: tuple[str, ...]     # tier per table
    kv: str                     # KV tier
    feasible: bool
    sessions_per_card: int      # N (0 when it cannot be built)
    tokens_per_s_per_card: float  # N / step, tokens/s (0 when it cannot be built)
    count: int                  # instances of it in the plan (0: not chosen)


@dataclass
class MemoryStack:
    """HBM per card of one option at its N, GB (1e9 B); sums to the model's ``hbm_used``."""

    label: str
    count: int                  # instances in the plan (0: a comparison option)
    size: int
    fabric: str                 # NVLink | NIC
    sessions_per_card: int
    tables: tuple[str, ...]
    kv: str
    replicated_gb: float        # replicated resident weights (every card holds them)
    experts_gb: float           # routed experts / S
    tables_gb: float            # tables placed in HBM with their projections / S
    kv_gb: float                # N x KV per session when the KV is in HBM, else 0
    reserve_gb: float           # U

    @property
    def total_gb(self) -> float:
        return self.replicated_gb + self.experts_gb + self.tables_gb + self.kv_gb + self.reserve_gb


@dataclass
class SupernodeOptionsData:
    name: str
    objective: str              # throughput | sessions | cards | single_user
    table_names: list[str]
    options: list[OptionPoint]
    stacks: list[MemoryStack]   # the plan's options and the best of every other size/fabric, options order
    capacity_gb: float          # HBM per card


def supernode_options_data(report) -> Optional[SupernodeOptionsData]:
    """Every option's N and tokens/s per card, and the memory split of the plan's options.

    Memory per card (reference chapter eq 6-14 and eq 6-1): ``W_replicated_resident +
    W_routed / S + W_tables_in_HBM x (1 + projections / table bytes) / S + N x K + U``; the
    comparison stacks are the report's alternatives, the first feasible one of every size and
    fabric the plan does not use.

    Returns:
        None when the report has no plan.
    Raises:
        RuntimeError: the split disagrees with the performance model's weights per card or HBM
            used (a bug in one of the two).
    """
    from optimizer.supernode.perf import SCALE_UP, table_extra_share

    res, p = report.solution, report.problem
    if res.plan is None or report.evaluation is None:
        return None
    options = []
    for j, r in enumerate(res.results):
        o = r.option
        options.append(OptionPoint(o.label(p), o.size, "NVLink" if o.fabric == SCALE_UP else "NIC", tuple(o.tables),
                                   o.kv, r.feasible, r.sessions_per_card if r.feasible else 0,
                                   r.figures.tokens_per_s_card if r.feasible else 0.0, res.plan.counts.get(j, 0)))
    index = {o.label: j for j, o in enumerate(options)}
    picks = sorted(res.plan.counts)
    groups = {(res.results[j].option.size, res.results[j].option.fabric) for j in picks}
    for alt in report.alternatives:
        j = index.get(alt["option"])
        if j is None or not res.results[j].feasible:
            continue
        key = (res.results[j].option.size, res.results[j].option.fabric)
        if key not in groups:
            groups.add(key)
            picks.append(j)
    inv = p.inventory
    share = 1 + table_extra_share(p)
    stacks = []
    for j in picks:
        r = res.results[j]
        o, f = r.option, r.figures
        S, n = o.size, r.sessions_per_card
        experts = inv.routed_bytes / S
        tables = sum(t.bytes * share for t, tier in zip(inv.tables, o.tables) if tier == "hbm") / S
        kv = n * f.kv_per_session if o.kv == "hbm" else 0.0
        weights = inv.replicated_resident_bytes + experts + tables
        total = weights + kv + p.reserve_bytes
        for what, mine, model in (("weights per card", weights, f.weights_per_card), ("HBM used", total, f.hbm_used)):
            if abs(mine - model) > 1e-9 * max(model, 1.0):
                raise RuntimeError(f"{o.label(p)}: {what} split {mine} B != performance model {model} B")
        stacks.append(MemoryStack(options[j].label, res.plan.counts.get(j, 0), S, options[j].fabric, n, tuple(o.tables), o.kv,
                                  inv.replicated_resident_bytes / 1e9, experts / 1e9, tables / 1e9, kv / 1e9,
                                  p.reserve_bytes / 1e9))
    stacks.sort(key=lambda s: index[s.label])  # options order: by size, then placement
    return SupernodeOptionsData(p.name, res.objective.name, [t.name for t in inv.tables], options, stacks,
                                p.hw.memory_bytes / 1e9)


# ============================================================================ figure
def _short(o) -> str:
    """Tick label of an option: size and fabric, table tiers, KV tier."""
    head = f"S={o.size}" + (" NIC" if o.fabric == "NIC" else "")
    tabs = ",".join(o.tables) if o.tables else "-"
    return f"{head}\n{tabs}\nKV {o.kv}"


def _option_axis(ax, d: SupernodeOptionsData, values: np.ndarray, ylabel: str, fmt: str, kv_colour: dict):
    opts = d.options
    x = np.arange(len(opts))
    colours = [CHOSEN if o.count else kv_colour[o.kv] for o in opts]
    edges = ["black" if o.count else "none" for o in opts]
    ax.bar(x, values, width=0.8, color=colours, edgecolor=edges, linewidth=1.2)
    bad = [k for k, o in enumerate(opts) if not o.feasible]
    if bad:
        ax.scatter(bad, np.zeros(len(bad)), marker="x", color="#555555", s=18, zorder=3)
    top = float(values.max()) if len(values) else 1.0
    for k, o in enumerate(opts):
        if o.count:
            ax.scatter([k], [values[k] + 0.04 * top], marker="v", color=CHOSEN, s=40, zorder=4)
        if len(opts) <= 12 and o.feasible:
            ax.text(k, values[k] + 0.09 * top, fmt.format(values[k]), ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, top * (1.25 if len(opts) <= 12 else 1.12) or 1.0)
    # separators and labels of the size/fabric groups (options come grouped in perf.options order)
    starts = [k for k in range(len(opts)) if k == 0 or (opts[k].size, opts[k].fabric)
              != (opts[k - 1].size, opts[k - 1].fabric)]
    for s in starts[1:]:
        ax.axvline(s - 0.5, color="black", linewidth=0.6, alpha=0.5)
    ax.set_xlim(-0.6, len(opts) - 0.4)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    return starts


def _tier_strip(ax, d: SupernodeOptionsData, tier_colour: dict) -> None:
    """One row per table and one for the KV: the tier of each option as a coloured cell."""
    from matplotlib.colors import ListedColormap

    tiers = list(tier_colour)
    rows = [[tiers.index(o.tables[i]) for o in d.options] for i in range(len(d.table_names))]
    rows.append([tiers.index(o.kv) for o in d.options])
    ax.imshow(np.array(rows), aspect="auto", interpolation="nearest", vmin=-0.5, vmax=len(tiers) - 0.5,
              cmap=ListedColormap([tier_colour[t] for t in tiers]), extent=(-0.5, len(d.options) - 0.5,
                                                                            len(rows) - 0.5, -0.5))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"table {t}" for t in d.table_names] + ["KV"], fontsize=7)


def _options_figure(d: SupernodeOptionsData):
    from matplotlib import colormaps
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    opts = d.options
    n = len(opts)
    many = n > MAX_LABELLED
    kv_tiers = sorted({o.kv for o in opts})
    cmap = colormaps["tab10"]
    kv_colour = {t: cmap(i % 10) for i, t in enumerate(kv_tiers)}
    fig = figure(min(18.0, 8.0 + 0.04 * n) if many else min(18.0, max(8.0, 0.42 * n + 3.0)), 11.0 if many else 10.5)
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.6 if many else 1.45, 1.0])
    if many:
        ax_n, ax_t, ax_s = top.subplots(3, 1, sharex=True, height_ratios=[1.0, 1.0, 0.12 * (len(d.table_names) + 1)])
    else:
        (ax_n, ax_t), ax_s = top.subplots(2, 1, sharex=True), None
    sessions = np.array([o.sessions_per_card for o in opts], dtype=float)
    tokens = np.array([o.tokens_per_s_per_card for o in opts], dtype=float)
    starts = _option_axis(ax_n, d, sessions, "sessions per card N", "{:.0f}", kv_colour)
    _option_axis(ax_t, d, tokens, "tokens/s per card", "{:,.0f}", kv_colour)
    tabs = "/".join(d.table_names) if d.table_names else "no tables"
    if many:
        all_tiers = sorted({t for o in opts for t in o.tables} | set(kv_tiers))
        tier_colour = {t: colormaps["Set2"](i % 8) for i, t in enumerate(all_tiers)}
        _tier_strip(ax_s, d, tier_colour)
        ends = starts[1:] + [n]
        ax_s.set_xticks([(a + b - 1) / 2 for a, b in zip(starts, ends)])
        ax_s.set_xticklabels([f"S={opts[a].size}" + (" NIC" if opts[a].fabric == "NIC" else "")
                              + f"\n{b - a} options" for a, b in zip(starts, ends)], fontsize=7)
        ax_s.set_xlabel("option: size S (groups), tier of each table and of the KV (cells)", fontsize=8)
        ax_s.legend(handles=[Patch(color=tier_colour[t], label=t) for t in all_tiers], fontsize=7, title="tier",
                    title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.6))
    else:
        ax_t.set_xticks(range(n))
        ax_t.set_xticklabels([_short(o) for o in opts], fontsize=7)
        ax_t.set_xlabel(f"option: size S, tier per table ({tabs}), KV tier", fontsize=8)
    handles = [Patch(color=kv_colour[t], label=f"KV in {t}") for t in kv_tiers]
    handles.append(Patch(facecolor=CHOSEN, edgecolor="black", label="chosen"))
    if any(not o.feasible for o in opts):
        handles.append(Line2D([], [], marker="x", color="#555555", linestyle="none", label="cannot be built"))
    ax_n.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    chosen = "; ".join(f"{o.count} x {o.label}" for o in opts if o.count)
    ax_n.set_title(f"{d.name}\nobjective {d.objective}; chosen: {chosen}", fontsize=9)

    ax = bottom.subplots()
    st = d.stacks
    x = np.arange(len(st))
    parts = [("replicated weights", [s.replicated_gb for s in st], WEIGHTS),
             ("routed experts / S", [s.experts_gb for s in st], EXPERTS),
             ("tables in HBM / S", [s.tables_gb for s in st], TABLES),
             ("KV (N x per session)", [s.kv_gb for s in st], KV),
             ("reserve U", [s.reserve_gb for s in st], RESERVE)]
    base = np.zeros(len(st))
    for name, vals, colour in parts:
        ax.bar(x, vals, bottom=base, width=0.55, color=colour, label=name)
        base += np.asarray(vals)
    picked = [k for k, s in enumerate(st) if s.count]
    ax.bar(picked, base[picked], width=0.55, fill=False, edgecolor=CHOSEN, linewidth=2.0)
    ax.axhline(d.capacity_gb, color="black", linestyle="--", linewidth=1, label=f"HBM {d.capacity_gb:g} GB")
    for k, s in enumerate(st):
        ax.text(k, s.total_gb + 0.01 * d.capacity_gb, f"{s.total_gb:.2f} GB\nN={s.sessions_per_card}",
                ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x)
    ax.set_xticklabels([(f"chosen x{s.count}" if s.count else "best at this size")
                        + f"\nS={s.size}{' NIC' if s.fabric == 'NIC' else ''}, tables {','.join(s.tables) or '-'}"
                        + f"\nKV {s.kv}" for s in st], fontsize=7)
    for lab, s in zip(ax.get_xticklabels(), st):
        if s.count:
            lab.set_color(CHOSEN)
    ax.set_ylim(0, max(d.capacity_gb, float(base.max())) * 1.2)
    ax.set_xlim(-0.6, len(st) - 0.4)
    ax.set_ylabel("memory per card (GB)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("memory per card: W_card = replicated + (experts + tables in HBM) / S (eq 6-14), "
                 "+ N x KV + U (eq 6-1)", fontsize=9)
    return fig
