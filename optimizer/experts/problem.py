"""Load an experts instance, build the plans (trivial, greedy, optimised) and score them."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from optimizer.budget import Budget
from optimizer.errors import InputError
from optimizer.experts import eplb
from optimizer.experts.plan import (LayerPlan, balancedness, cross_node_tokens, moves, plan_from_phy2log,
                                    trivial_plan)
from optimizer.experts.schema import ExpertsSection, parse, slots_list
from optimizer.experts.solve import LayerTask, parallel_workers, solve_layers
from optimizer.experts.traces import Trace, read_trace
from optimizer.result import ConstraintKey

OBJECTIVES = ("max-load", "inter-node", "migration")


@dataclass
class Windows:
    """Window indices (0-based, in trace order) the plan is fitted on and scored on.

    The fitted windows' loads are summed into one load vector per layer; held-out windows
    are scored both summed and one by one (see :func:`held_out_scores`).
    """

    fit: list[int]
    evaluate: list[int] | None  # None: no held-out window


def select_windows(n: int, fit: str, evaluate: str, file: Path) -> Windows:
    """Fitted and held-out window indices (see ExpertsSection.evaluate_windows).

    Raises:
        InputError: ``first:N`` / ``last:N`` asks for more windows than there are.
    """
    holdout = evaluate != "none" and n >= 2
    if fit.startswith("first:"):
        k = int(fit.split(":")[1])
        if k > n:
            raise InputError(file, "experts.fit_windows", f"first:{k} but the trace has {n} windows")
        fr = (0, k)
    else:
        usable = n - 1 if holdout else n
        if fit == "all":
            fr = (0, usable)
        else:
            k = int(fit.split(":")[1])
            if k > usable:
                raise InputError(file, "experts.fit_windows", f"last:{k} but the trace has {usable} windows to fit "
                                                              f"({n} in all{', one held out' if holdout else ''})")
            fr = (usable - k, usable)
    ev = None
    if evaluate == "next" and fr[1] < n:
        ev = [fr[1]]
    elif evaluate == "rest" and fr[1] < n:
        ev = list(range(fr[1], n))
    return Windows(list(range(*fr)), ev)


def held_out_scores(plan: LayerPlan, loads: np.ndarray, windows: list[int]) -> dict:
    """Scores of one layer's plan on held-out windows.

    Args:
        plan: the layer's plan.
        loads: ``[windows, experts]`` token counts of this layer, all windows of the trace.
        windows: held-out window indices.
    Returns:
        ``{"windows", "summed": {max_load, mean_load, balancedness} of the windows' summed
        loads, "per_window": [{window, max_load, mean_load, balancedness}], "worst_window":
        the per-window entry with the lowest balancedness (ties: first)}``; loads in tokens.
    """
    def one(w):
        ld = plan.loads(w)
        return {"max_load": float(ld.max()), "mean_load": float(ld.mean()), "balancedness": balancedness(ld)}

    per = [{"window": int(k), **one(loads[k])} for k in windows]
    worst = min(per, key=lambda d: d["balancedness"])
    return {"windows": [int(k) for k in windows], "summed": one(loads[windows].sum(axis=0)),
            "per_window": per, "worst_window": worst}


def read_previous(path: Path, layers: int, num_experts: int, num_replicas: int) -> np.ndarray:
    """phy2log ``[layers, replicas]`` from placement.json, SGLang's JSON, or a bare list."""
    if not path.exists():
        raise InputError(path, "", "previous placement not found")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError, UnicodeDecodeError) as exc:
        raise InputError(path, "", f"not a readable JSON file: {exc}") from None
    if isinstance(data, dict):
        for k in ("phy2log", "physical_to_logical_map"):
            if k in data:
                data = data[k]
                break
        else:
            raise InputError(path, "", "expected phy2log or physical_to_logical_map")
    try:
        arr = np.asarray(data, dtype=np.int64)
    except (ValueError, TypeError):
        raise InputError(path, "", "wrong shape: expected [layers, replicas] integers") from None
    if arr.shape != (layers, num_replicas):
        raise InputError(path, "", f"wrong shape {list(arr.shape)}, expected [{layers}, {num_replicas}] "
                                   "(trace layers, GPUs x slots)")
    bad = np.argwhere((arr < 0) | (arr >= num_experts))
    if bad.size:
        i, r = bad[0]
        raise InputError(path, f"layer {i}, replica {r}", f"expert id {arr[i, r]} out of range 0..{num_experts - 1}")
    return arr


def greedy_plans(loads: np.ndarray, slots: list[int], num_groups: int, num_nodes: int) -> tuple[np.ndarray, str]:
    """EPLB phy2log ``[layers, replicas]`` and the policy used (hierarchical/global)."""
    L, E = loads.shape
    G = len(slots)
    R = int(sum(slots))
    if len(set(slots)) == 1:
        hier = num_groups % num_nodes == 0 and E % num_groups == 0
        p2l, _, _ = eplb.rebalance(loads, R, num_groups, num_nodes, G)
        return p2l, "hierarchical" if hier else "global"
    # unequal slots: the global policy with per-GPU capacities
    rep2exp, _, cnt = eplb.replicate(loads.astype(np.float64), R)
    per = np.take_along_axis(loads / cnt, rep2exp, axis=1)
    pack, rank = eplb.balanced_packing(per, G, capacities=slots)
    offs = np.concatenate([[0], np.cumsum(slots)[:-1]])
    p2l = np.zeros((L, R), dtype=np.int64)
    for i in range(L):
        p2l[i, offs[pack[i]] + rank[i]] = rep2exp[i]
    return p2l, "global (per-GPU slots)"


def run_problem(raw: dict, path: Path, objective: str | None, time_limit_s: float | None,
                output_dir: Path | None, deadline: float | None = None):
    from optimizer.experts.report import ExpertsReport, LayerRow, PlanScore

    end = deadline if deadline is not None or time_limit_s is None else Budget.for_command(time_limit_s).deadline
    objective = objective or "max-load"
    if objective not in OBJECTIVES:
        raise InputError("--objective", "", f"unknown objective {objective!r} for experts (expected {', '.join(OBJECTIVES)})")
    inst = parse(raw, path)
    ex: ExpertsSection = inst.experts
    slots = slots_list(ex)
    G, N = ex.num_gpus, ex.num_nodes
    R = int(sum(slots))
    trace_path = (path.parent / ex.trace).resolve() if not Path(ex.trace).is_absolute() else Path(ex.trace)
    if not trace_path.exists():  # a file, or a folder of files (the ESFT layout)
        raise InputError(path, "experts.trace", f"trace not found: {trace_path}")
    trace: Trace = read_trace(trace_path, ex.format, ex.num_experts, ex.window_tokens, ex.top_k)
    E, L = trace.num_experts, trace.num_layers
    if R < E:
        raise InputError(path, "experts.slots_per_gpu", f"{R} physical slots cannot hold {E} experts (need at least one each)")
    if objective == "migration" and ex.previous_placement is None:
        raise InputError(path, "experts.previous_placement", "the migration objective needs a previous placement")
    win = select_windows(trace.num_windows, ex.fit_windows, ex.evaluate_windows, path)
    fit = trace.loads[win.fit].sum(axis=0)
    prev_p2l = None
    if ex.previous_placement is not None:
        pp = (path.parent / ex.previous_placement) if not Path(ex.previous_placement).is_absolute() else Path(ex.previous_placement)
        prev_p2l = read_previous(pp, L, E, R)
    node_of = [g // (G // N) for g in range(G)]

    meta = dict(name=inst.name, objective=objective, trace=trace, windows=win, slots=slots, num_gpus=G,
                num_nodes=N, num_groups=ex.num_groups, split=ex.split, num_replicas=R)
    # infeasible: every GPU needs slots distinct experts
    if max(slots) > E:
        g = int(np.argmax(slots))
        keys = [ConstraintKey("gpu_slots", f"layer 0, gpu {g}"), ConstraintKey("distinct_gpus", "layer 0")]
        return ExpertsReport.infeasible(meta, keys, f"GPU {g} has {slots[g]} slots but only {E} experts exist, "
                                                    "and replicas of one expert must sit on distinct GPUs")

    p2l_greedy, policy = greedy_plans(fit, slots, ex.num_groups, N)
    meta["greedy_policy"] = policy
    greedy = [plan_from_phy2log(p2l_greedy[i], E, slots) for i in range(L)]
    trivial = trivial_plan(E, slots)
    prev = [plan_from_phy2log(prev_p2l[i], E, slots) for i in range(L)] if prev_p2l is not None else None

    # work limit per layer (deterministic); --time-limit is a wall-clock guard split across layers
    par = parallel_workers(L, E, G, ex.workers)
    # (what is left of the command's budget, counted from the process start)
    left = None if end is None else end - time.perf_counter()
    guard = None if left is None else max(0.005, left * par / L)  # spent: the start plans, nearly at once
    tasks = [LayerTask(i, fit[i], slots, node_of, N, ex.split, objective, greedy[i],
                       prev[i].X if prev is not None else None, ex.migration_weight, ex.max_load_tolerance,
                       guard, work_limit=ex.work_units_per_layer) for i in range(L)]
    t0 = time.perf_counter()
    outs = solve_layers(tasks, ex.workers)
    wall = time.perf_counter() - t0

    rows = []
    for i, o in enumerate(outs):
        ref = prev[i] if prev is not None else trivial

        def score(plan: LayerPlan, is_opt: bool) -> PlanScore:
            ld = plan.loads(fit[i])
            mx = float(ld.max())
            ev = held_out_scores(plan, trace.loads[:, i, :], win.evaluate) if win.evaluate else None
            # the bound holds for plans with distinct GPUs only: no gap for a co-located plan
            gap = None if plan.X.max() > 1 else (0.0 if mx <= 0 else max(0.0, (mx - o.bound) / mx))
            return PlanScore(max_load=mx, mean_load=float(ld.mean()), balancedness=balancedness(ld),
                             bound=o.bound, gap=gap,
                             moves=moves(plan, ref), cross_node_tokens=cross_node_tokens(plan, fit[i], np.array(node_of), N),
                             evaluation=ev)

        opt = score(o.plan, True)
        opt.gap = o.gap
        rows.append(LayerRow(layer=i, name=trace.layer_names[i], trivial=score(trivial, False),
                             greedy=score(greedy[i], False), optimized=opt, outcome=o))
    report = ExpertsReport(meta, rows, wall, moves_from="previous_placement" if prev is not None else "trivial placement")
    if output_dir is not None:
        report.write_outputs(output_dir)
    return report
