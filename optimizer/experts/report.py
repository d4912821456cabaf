"""Report of an experts run: per-layer table, ``--format json`` object, output files."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optimizer.experts.eplb import log2phy_from
from optimizer.experts.solve import OPTIMALITY_REL_TOL
from optimizer.result import ConstraintKey, Status, envelope, group_conflicts

DEFINITIONS = {
    "plan.layers[].*.max_load": "routed tokens on the busiest GPU of the layer (fitted windows summed)",
    "plan.layers[].*.mean_load": "routed tokens per GPU on average (fitted windows summed)",
    "plan.layers[].*.balancedness": "mean_load / max_load (1 = perfectly balanced)",
    "plan.layers[].*.bound": "a lower bound on max_load valid for every placement with distinct experts per GPU",
    "plan.layers[].*.gap": "(max_load - bound) / max_load",
    "plan.layers[].*.moves": "expert copies to load relative to the previous placement (or the trivial layout)",
    "plan.layers[].*.cross_node_tokens": "routed tokens (spread evenly over nodes) whose expert has no copy on their node",
    "plan.layers[].*.held_out": "the same plan scored on the held-out windows: summed, per window, and the worst window",
    "plan.trace.fitted_windows": "window indices whose loads are summed to fit the plan",
    "plan.trace.evaluated_windows": "held-out window indices the plan is scored on",
    "plan.outputs": "files written with --output (placement.json: phy2log/log2phy/logcnt; SGLang expert location)",
    "alternatives[]": "the trivial layout and the greedy EPLB plan, scored on the same windows",
}


@dataclass(frozen=True)
class PlanScore:
    """Scores of one plan on one layer (loads in tokens)."""

    max_load: float
    mean_load: float
    balancedness: float
    bound: float | None         # the layer's valid lower bound (None: not scored against one)
    gap: float | None           # None for a plan the bound does not apply to (co-located replicas)
    moves: int | None
    cross_node_tokens: float
    evaluation: dict | None = None   # problem.held_out_scores, None without held-out windows

    def to_dict(self) -> dict[str, Any]:
        return {"max_load": self.max_load, "mean_load": self.mean_load, "balancedness": self.balancedness,
                "bound": self.bound, "gap": self.gap, "moves": self.moves,
                "cross_node_tokens": self.cross_node_tokens, "held_out": self.evaluation}


@dataclass(frozen=True)
class LayerRow:
    layer: int
    name: str
    trivial: PlanScore
    greedy: PlanScore
    optimized: PlanScore
    outcome: Any  # solve.LayerOutcome


@dataclass
class ExpertsReport:
    """Result of one experts run (``status``, ``to_dict()``, ``render(console)``,
    ``write(folder)``), built once from the data, the solution and the explanation.

    Attributes:
        data: the loaded instance (objective, trace, windows, GPUs and slots).
        solution: the frozen per-layer outcomes.
        explanation: the per-layer scores against the trivial and greedy plans.
        outputs: the files :meth:`write` wrote (``--output``).
    """

    data: Any  # optimizer.experts.problem.ExpertsData
    solution: Any  # optimizer.experts.problem.ExpertsSolution
    explanation: Any  # optimizer.experts.problem.ExpertsExplanation
    outputs: list = field(default_factory=list)

    @property
    def rows(self) -> tuple[LayerRow, ...]:
        return self.explanation.rows

    @property
    def wall_s(self) -> float:
        return self.solution.wall_s

    @property
    def moves_from(self) -> str:
        return self.explanation.moves_from

    @property
    def conflict(self) -> tuple[ConstraintKey, ...]:
        return self.solution.conflict

    @property
    def conflict_detail(self) -> str:
        return self.explanation.conflict_detail

    @property
    def status(self) -> Status:
        return self.solution.status

    # ----------------------------------------------------------------- summary
    def summary(self) -> dict[str, Any]:
        if not self.rows:
            return {}

        def agg(kind: str) -> dict[str, Any]:
            ps = [getattr(r, kind) for r in self.rows]
            gaps = [p.gap for p in ps]
            out = {"mean_balancedness": float(np.mean([p.balancedness for p in ps])),
                   "sum_max_load": float(sum(p.max_load for p in ps)),
                   "mean_gap": None if any(g is None for g in gaps) else float(np.mean(gaps)),
                   "cross_node_tokens": float(sum(p.cross_node_tokens for p in ps))}
            mv = [p.moves for p in ps]
            out["moves"] = None if any(m is None for m in mv) else int(sum(mv))
            if ps[0].evaluation is not None:
                ev = [p.evaluation for p in ps]
                out["held_out"] = {
                    "windows": ev[0]["windows"],
                    "summed_mean_balancedness": float(np.mean([e["summed"]["balancedness"] for e in ev])),
                    "summed_sum_max_load": float(sum(e["summed"]["max_load"] for e in ev)),
                    "worst_window_mean_balancedness": float(np.mean([e["worst_window"]["balancedness"] for e in ev])),
                    "worst_window_min_balancedness": float(min(e["worst_window"]["balancedness"] for e in ev)),
                }
            return out

        proven = [r.layer for r in self.rows if r.outcome.proven]
        obj = float(sum(r.optimized.max_load for r in self.rows))
        bnd = float(sum(r.optimized.bound for r in self.rows))
        return {
            "layers": len(self.rows),
            "status": self.status.value,
            "objective_sum_max_load": obj,
            "bound_sum_max_load": bnd,
            "gap": 0.0 if obj <= 0 else max(0.0, (obj - bnd) / obj),
            "optimality_tolerance": OPTIMALITY_REL_TOL,
            "proven_optimal_layers": proven,
            "proven_optimal_count": len(proven),
            "max_gap": float(max(r.optimized.gap for r in self.rows)),
            "greedy_colocated_layers": [r.layer for r in self.rows if r.outcome.greedy_colocated],
            "reproducible": all(r.outcome.reproducible for r in self.rows),
            "trivial": agg("trivial"), "greedy": agg("greedy"), "optimized": agg("optimized"),
            "solve_time_s": self.wall_s, "moves_from": self.moves_from,
        }

    def to_dict(self) -> dict[str, Any]:
        """The result envelope (:func:`optimizer.result.envelope`); the placement is under ``plan``."""
        m = self.data
        tr = m.trace
        win = m.windows
        obj = m.objective
        plan: dict[str, Any] = {
            "trace": {"file": str(tr.file), "format": tr.format, "windows": tr.num_windows, "window_kind": tr.window_kind,
                      "layers": tr.num_layers, "experts": tr.num_experts, "top_k": tr.top_k,
                      "fitted_windows": list(win.fit), "evaluated_windows": list(win.evaluate) if win.evaluate else None,
                      "fitted_windows_scored": "summed", "evaluated_windows_scored": "summed and per window"},
            "setup": {"num_gpus": m.num_gpus, "num_nodes": m.num_nodes, "slots_per_gpu": m.slots,
                      "num_replicas": m.num_replicas, "num_groups": m.num_groups, "split": m.split,
                      "greedy_policy": self.solution.greedy_policy},
            "units": {"load": "tokens (routed token-expert assignments)", "gap": "relative to max_load",
                      "optimal": f"gap <= {OPTIMALITY_REL_TOL:g} against a bound valid for every plan with distinct GPUs",
                      "work": "CP-SAT deterministic time"},
        }
        objective = {"name": obj.name, "unit": obj.unit, "definition": obj.definition, "sense": obj.sense,
                     "value": None, "bound": None, "gap": None}
        conflicts = []
        if self.conflict:
            conflicts = group_conflicts(self.conflict, {k: self.conflict_detail for k in self.conflict})
        else:
            plan["layers"] = [{
                "layer": r.layer, "name": r.name,
                "trivial": r.trivial.to_dict(), "greedy": r.greedy.to_dict(),
                "optimized": {**r.optimized.to_dict(), "status": r.outcome.status.value,
                              "proven_optimal": r.outcome.proven, "method": r.outcome.mode,
                              "greedy_colocated": r.outcome.greedy_colocated, "time_s": r.outcome.time_s,
                              "work": r.outcome.work, "reproducible": r.outcome.reproducible,
                              "solves": r.outcome.solves, "secondary_status": r.outcome.phase2_status,
                              "notes": r.outcome.notes},
            } for r in self.rows]
            summ = self.summary()
            plan["summary"] = summ
            plan["outputs"] = [str(f) for f in self.outputs]
            value, bound, gap = obj.envelope_value(summ, self.status == Status.OPTIMAL)
            objective.update(value=value, bound=bound, gap=gap)
        gap = objective["gap"]
        return envelope(
            "experts", m.name or "", self.status, objective, None if self.conflict else plan,
            {"name": "cp-sat (exact per layer, LNS on large layers)", "status": self.status.value,
             "time_s": round(self.wall_s, 4), "gap": gap},
            alternatives=[] if self.conflict else self.alternatives_rows(),
            conflicts=conflicts,
            definitions=DEFINITIONS,
        )

    def alternatives_rows(self) -> list[dict[str, Any]]:
        """The trivial layout and the greedy (EPLB) plan, each with why it lost to the optimised plan."""
        summ = self.summary()
        out = []
        opt = summ["optimized"]["sum_max_load"]
        for kind, label in (("trivial", "trivial layout (one replica per expert, in order)"),
                            ("greedy", "greedy EPLB plan")):
            a = summ[kind]
            worse = a["sum_max_load"] - opt
            if kind == "greedy" and summ["greedy_colocated_layers"]:
                reason = "invalid"
                detail = (f"puts two replicas of one expert on one GPU on {len(summ['greedy_colocated_layers'])} "
                          f"layer(s) (EPLB allows it; written plans never do); sum of max loads {a['sum_max_load']:.6g}")
            else:
                reason = "objective" if worse > 0 else "tie"
                detail = f"sum of max loads {a['sum_max_load']:.6g} vs {opt:.6g} optimised"
            out.append({"option": label, "reason": reason, "detail": detail, "sum_max_load": a["sum_max_load"],
                        "mean_balancedness": a["mean_balancedness"]})
        return out

    # ----------------------------------------------------------------- outputs
    def placement(self) -> dict[str, Any]:
        slots = self.data.slots
        E = self.data.trace.num_experts
        p2l = np.stack([r.outcome.plan.phy2log(slots) for r in self.rows])
        logcnt = np.stack([np.bincount(row, minlength=E) for row in p2l])
        out = {"phy2log": p2l.tolist(), "log2phy": log2phy_from(p2l, E).tolist(), "logcnt": logcnt.tolist(),
               "num_gpus": self.data.num_gpus, "slots_per_gpu": slots,
               "layers": [r.name for r in self.rows], "split": self.data.split}
        if self.data.split == "optimal":
            out["replica_share"] = [r.outcome.plan.replica_shares(slots).tolist() for r in self.rows]
        return out

    def write(self, folder: Path) -> list[Path]:
        """Write ``placement.json`` (phy2log, log2phy, logcnt) and ``sglang_expert_location.json``
        into ``folder``; returns the files written (none without a plan)."""
        if not self.rows:
            return []
        folder.mkdir(parents=True, exist_ok=True)
        pl = self.placement()
        (folder / "placement.json").write_text(json.dumps(pl))
        (folder / "sglang_expert_location.json").write_text(json.dumps({"physical_to_logical_map": pl["phy2log"]}))
        return [folder / "placement.json", folder / "sglang_expert_location.json"]

    # ----------------------------------------------------------------- table
    def _held_out_table(self, windows: list[int]):
        """Balancedness on the held-out windows: summed (one window: that window), and the
        worst single window when there are several."""
        from rich.table import Table

        several = len(windows) > 1
        label = _windows_label(windows)
        title = (f"Held out: {label}, balancedness of their summed loads and of the worst single window"
                 if several else f"Held out: {label}, balancedness")
        t = Table(title=title)
        t.add_column("layer", justify="right")
        scored = "summed" if several else label
        for plan in ("greedy", "optimised"):
            t.add_column(f"{scored}: {plan}", justify="right")
        if several:
            for plan in ("greedy", "optimised"):
                t.add_column(f"worst: {plan}", justify="right")
        for r in self.rows:
            g, o = r.greedy.evaluation, r.optimized.evaluation
            cells = [r.name, f"{g['summed']['balancedness']:.3f}", f"{o['summed']['balancedness']:.3f}"]
            if several:
                cells += [f"{e['worst_window']['balancedness']:.3f} (window {e['worst_window']['window']})"
                          for e in (g, o)]
            t.add_row(*cells)
        return t

    def render(self, console) -> None:
        from rich.table import Table

        m = self.data
        tr = m.trace
        console.print(f"[bold]{m.name or 'experts'}[/bold]: {tr.num_layers} layers x {tr.num_experts} experts, "
                      f"{m.num_replicas} slots on {m.num_gpus} GPUs / {m.num_nodes} nodes, "
                      f"objective {m.objective.name}, split {m.split}")
        win = m.windows
        console.print(f"trace {tr.file} ({tr.format}, {tr.num_windows} x {tr.window_kind}); fitted on "
                      f"{_windows_label(win.fit)}" + (f" (summed); held out: {_windows_label(win.evaluate)}"
                                                     if win.evaluate else " (summed); no held-out window"))
        if self.conflict:
            console.print(f"[red]infeasible[/red]: {self.conflict_detail}")
            console.print("conflicting constraints: " + ", ".join(str(k) for k in self.conflict))
            return
        t = Table(title="Busiest GPU per layer: max load in tokens (balancedness = mean/max)")
        secondary = not m.objective.balances_load  # the table's bound and gap are the max load's
        for col in ("layer", "trivial", "greedy", "optimised", "bound", "max-load gap" if secondary else "gap",
                    "moves", "status"):
            t.add_column(col, justify="right")
        for r in self.rows:
            cells = [r.name, f"{_tok(r.trivial.max_load)} ({r.trivial.balancedness:.2f})",
                     f"{_tok(r.greedy.max_load)} ({r.greedy.balancedness:.3f})" + ("*" if r.outcome.greedy_colocated else ""),
                     f"{_tok(r.optimized.max_load)} ({r.optimized.balancedness:.3f})",
                     _tok(r.optimized.bound), f"{100 * r.optimized.gap:.2f}%",
                     "-" if r.optimized.moves is None else str(r.optimized.moves),
                     r.outcome.status.value]
            t.add_row(*cells)
        console.print(t)
        if any(r.outcome.greedy_colocated for r in self.rows):
            console.print("* greedy puts two replicas of one expert on one GPU (EPLB allows it; written plans never do)")
        if self.rows[0].greedy.evaluation is not None:
            console.print(self._held_out_table(win.evaluate))
        s = self.summary()
        line = (f"status {self.status.value}; mean balancedness trivial {s['trivial']['mean_balancedness']:.3f}, "
                f"greedy {s['greedy']['mean_balancedness']:.3f}, optimised {s['optimized']['mean_balancedness']:.3f}; "
                f"mean {'max-load ' if secondary else ''}gap {100 * s['optimized']['mean_gap']:.2f}% "
                f"(max {100 * s['max_gap']:.2f}%); "
                f"optimal (gap <= {OPTIMALITY_REL_TOL:g}) on {s['proven_optimal_count']}/{s['layers']} layers; "
                f"{s['solve_time_s']:.1f} s")
        console.print(line)
        if secondary:  # the objective itself: its value, and a bound only where proven
            o = self.to_dict()["objective"]
            console.print(f"objective {o['name']}: {o['value']:.6g} {o['unit']} under the max-load cap; bound "
                          + (f"{o['bound']:.6g}, gap {100 * o['gap']:.2f}%" if o["bound"] is not None else
                             "not proven (layers solved by LNS or stopped early)"))
        if "held_out" in s["greedy"]:
            hg, ho = s["greedy"]["held_out"], s["optimized"]["held_out"]
            several = len(hg["windows"]) > 1
            console.print(f"held out {_windows_label(hg['windows'])}: mean balancedness "
                          f"{'of the summed windows ' if several else ''}greedy "
                          f"{hg['summed_mean_balancedness']:.3f}, optimised {ho['summed_mean_balancedness']:.3f}"
                          + (f"; worst single window (mean over layers) greedy {hg['worst_window_mean_balancedness']:.3f}, "
                             f"optimised {ho['worst_window_mean_balancedness']:.3f}" if len(hg["windows"]) > 1 else ""))
        if s["optimized"]["moves"] is not None:
            console.print(f"expert copies to load vs {self.moves_from}: greedy {s['greedy']['moves']}, "
                          f"optimised {s['optimized']['moves']}; cross-node tokens greedy "
                          f"{s['greedy']['cross_node_tokens']:.0f}, optimised {s['optimized']['cross_node_tokens']:.0f}")
        if not s["reproducible"]:
            console.print("[yellow]wall-clock limit reached before the work limit on some layers: results may "
                          "differ between runs[/yellow]")
        # the files written (self.outputs) are listed by the CLI, once, on stderr


def _windows_label(ws: list[int]) -> str:
    """``window 4`` / ``windows 4-7`` (consecutive) / ``windows 1, 3, 6``."""
    if len(ws) == 1:
        return f"window {ws[0]}"
    if ws == list(range(ws[0], ws[-1] + 1)):
        return f"windows {ws[0]}-{ws[-1]}"
    return "windows " + ", ".join(map(str, ws))


def _tok(x: float) -> str:
    """Tokens: whole numbers as such, else two decimals (fractional loads from split replicas)."""
    return f"{x:.0f}" if abs(x - round(x)) < 5e-7 * max(1.0, abs(x)) else f"{x:.2f}"
