"""Load an experts instance (:func:`load`), solve every layer (:func:`solve`), score the plans
(:func:`score_plan`) and explain them against the trivial and greedy plans (:func:`explain`)."""
from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from constraints.experts import replicas as experts_replicas
from constraints.experts import slots as experts_slots
from objectives.experts import ExpertsObjective
from optimizer.budget import Budget, ProgressSink, no_progress
from optimizer.cpsat import ortools_cp_model
from optimizer.errors import InputError, warn_input
from optimizer.experts import eplb
from optimizer.experts.plan import (LayerPlan, balancedness, cross_node_tokens, moves, plan_from_phy2log,
                                    trivial_plan)
from optimizer.experts.schema import ExpertsSection, parse, slots_list
from optimizer.experts.solve import (MIN_SOLVE_S, LayerOutcome, LayerTask, default_work, parallel_workers,
                                     solve_layers)
from optimizer.experts.traces import Trace, read_trace
from optimizer.result import ConstraintKey, Status


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


@dataclass(frozen=True)
class ExpertsData:
    """A validated experts instance with its trace (loads in tokens).

    Attributes:
        name: the instance's name.
        objective: the objective object (``objectives/experts/``).
        trace: the routing trace; ``windows``: the fitted and held-out windows.
        slots: physical replicas per GPU; ``num_replicas`` their sum.
        fit: ``[layers, experts]`` loads of the fitted windows, summed.
        previous: ``[layers, replicas]`` phy2log of the previous placement, None without one.
        section: the validated ``experts:`` section (split, tolerance, workers, work limit...).
    """

    name: str
    objective: ExpertsObjective
    trace: Trace
    windows: Windows
    slots: list[int]
    num_gpus: int
    num_nodes: int
    num_groups: int
    split: str
    num_replicas: int
    fit: np.ndarray
    previous: np.ndarray | None
    section: ExpertsSection

    @property
    def node_of(self) -> list[int]:
        """The node of every GPU (GPUs split evenly over nodes, in order)."""
        return [g // (self.num_gpus // self.num_nodes) for g in range(self.num_gpus)]


def load(raw: dict, path: Path, objective: str | None) -> ExpertsData:
    """Validate an experts instance, read its trace and previous placement.

    Raises:
        InputError: unknown objective; bad instance, trace or previous placement; fewer slots
            than experts; the objective needs a previous placement and none is given.
    """
    from objectives.base import default_of
    from objectives.experts import registry

    objectives = registry()
    name = objective or default_of(objectives)
    if name not in objectives:
        raise InputError(path, "--objective", f"unknown objective {name!r} for experts (one of: {', '.join(objectives)})")
    obj = objectives[name]
    path = Path(path)
    inst = parse(raw, path)
    ex: ExpertsSection = inst.experts
    slots = slots_list(ex)
    R = int(sum(slots))
    trace_path = (path.parent / ex.trace).resolve() if not Path(ex.trace).is_absolute() else Path(ex.trace)
    if not trace_path.exists():  # a file, or a folder of files (the ESFT layout)
        raise InputError(path, "experts.trace", f"trace not found: {trace_path}")
    trace: Trace = read_trace(trace_path, ex.format, ex.num_experts, ex.window_tokens, ex.top_k)
    E, L = trace.num_experts, trace.num_layers
    if R < E:
        raise InputError(path, "experts.slots_per_gpu", f"{R} physical slots cannot hold {E} experts (need at least one each)")
    if obj.needs_previous_placement and ex.previous_placement is None:
        raise InputError(path, "experts.previous_placement", f"the {obj.name} objective needs a previous placement")
    win = select_windows(trace.num_windows, ex.fit_windows, ex.evaluate_windows, path)
    prev_p2l = None
    if ex.previous_placement is not None:
        pp = (path.parent / ex.previous_placement) if not Path(ex.previous_placement).is_absolute() else Path(ex.previous_placement)
        prev_p2l = read_previous(pp, L, E, R)
    return ExpertsData(name=inst.name, objective=obj, trace=trace, windows=win, slots=slots, num_gpus=ex.num_gpus,
                       num_nodes=ex.num_nodes, num_groups=ex.num_groups, split=ex.split, num_replicas=R,
                       fit=trace.loads[win.fit].sum(axis=0), previous=prev_p2l, section=ex)


@dataclass(frozen=True)
class ExpertsPlan:
    """One placement per layer (in trace order)."""

    layers: tuple[LayerPlan, ...]


@dataclass(frozen=True)
class ExpertsSolution:
    """The optimised placement of every layer, never changed afterwards.

    Attributes:
        objective: the objective object.
        layers: each layer's outcome (plan, valid bound, gap, status, method).
        plan: the optimised plan (None when infeasible).
        greedy: EPLB's greedy plan of every layer (the comparison), ``greedy_policy`` its policy.
        conflict: conflicting constraint keys when infeasible (empty otherwise).
        wall_s: wall time of the layer solves, s.
    """

    objective: ExpertsObjective
    layers: tuple[LayerOutcome, ...] = ()
    plan: ExpertsPlan | None = None
    greedy: ExpertsPlan | None = None
    greedy_policy: str | None = None
    conflict: tuple[ConstraintKey, ...] = ()
    wall_s: float = 0.0

    @property
    def status(self) -> Status:
        if self.conflict:
            return Status.INFEASIBLE
        return Status.OPTIMAL if all(o.proven for o in self.layers) else Status.FEASIBLE


def solve(data: ExpertsData, budget: Budget, progress: ProgressSink = no_progress) -> ExpertsSolution:
    """Solve every layer (:func:`optimizer.experts.solve.solve_layers`).

    The search effort per layer is a fixed work limit (reproducible); ``budget`` is a wall-clock
    guard on top: each layer takes its share of the time left when it begins (layers solved in
    parallel share it), so the search ends by the budget's deadline. When the time left cannot
    pay for OR-Tools' import and a first solve per layer (:func:`search_needs_s`), no layer is
    searched: each keeps its best start plan (EPLB greedy when its replicas sit on distinct GPUs,
    else LPT or trivial) with the analytic bound, and a warning says so. ``progress`` gets a row
    per finished layer (throttled) and a final ``done`` row. A GPU with more slots than there
    are experts makes the instance infeasible (replicas of one expert sit on distinct GPUs).
    """
    ex = data.section
    slots, E, L = data.slots, data.trace.num_experts, data.trace.num_layers
    if max(slots) > E:
        g = int(np.argmax(slots))
        return ExpertsSolution(data.objective, conflict=(experts_slots.key(0, g),
                                                         ConstraintKey(experts_replicas.DISTINCT, "layer 0")))
    p2l_greedy, policy = greedy_plans(data.fit, slots, data.num_groups, data.num_nodes)
    greedy = [plan_from_phy2log(p2l_greedy[i], E, slots) for i in range(L)]
    prev = previous_plans(data)
    par = parallel_workers(L, E, data.num_gpus, ex.workers)
    need = search_needs_s(L, par)
    if budget.limited and budget.remaining_s() < need:
        _warn_no_search(budget, need)
        layer_budget = Budget(budget.start, budget.limit_s, budget.start, budget.cut)  # spent: start plans only
    else:
        ortools_cp_model()  # imported once here, before the workers fork, rather than once in each
        layer_budget = budget
    # layer i begins with about L - i layers (itself included) left for ``par`` processes
    tasks = [LayerTask(i, data.fit[i], slots, data.node_of, data.num_nodes, data.split, data.objective, greedy[i],
                       prev[i].X if prev is not None else None, ex.migration_weight, ex.max_load_tolerance,
                       None, work_limit=ex.work_units_per_layer or default_work(L, E, data.num_gpus), budget=layer_budget,
                       share=min(1.0, par / (L - i))) for i in range(L)]
    t0 = time.perf_counter()
    rows = _LayerProgress(progress, budget, L)
    outs = solve_layers(tasks, ex.workers, rows.layer)
    wall = time.perf_counter() - t0
    solution = ExpertsSolution(data.objective, tuple(outs), ExpertsPlan(tuple(o.plan for o in outs)),
                               ExpertsPlan(tuple(greedy)), policy, wall_s=wall)
    rows.done(solution)
    return solution


ORTOOLS_IMPORT_S = 0.45  # importing OR-Tools' cp_model (and pandas) on the 2-core machine: 0.41-0.47 s


def search_needs_s(layers: int, processes: int) -> float:
    """Seconds of budget the layer search needs to begin at all: OR-Tools' import when it is not
    loaded yet (:data:`ORTOOLS_IMPORT_S`) and :data:`~optimizer.experts.solve.MIN_SOLVE_S` per
    layer on each process."""
    imported = "ortools.sat.python.cp_model" in sys.modules
    return (0.0 if imported else ORTOOLS_IMPORT_S) + MIN_SOLVE_S * math.ceil(layers / max(1, processes))


def _warn_no_search(budget: Budget, need: float) -> None:
    """The one warning line of a budget too short for the layer search (see :func:`solve`)."""
    late, left = budget.elapsed_s(), budget.remaining_s()
    if budget.limit_s is not None and late >= budget.limit_s:
        what = f"the limit of {budget.limit_s:g} s (counted from the process start) had passed before the layer search began"
    else:
        what = (f"{left:.2f} s of the {budget.limit_s:g} s limit were left for the layer search, which needs {need:.2f} s to "
                "begin (OR-Tools' import and 5 ms a layer)")
    warn_input("--time-limit", "", f"{what} ({late:.2f} s of start-up and reading): every layer keeps its best start "
               "plan (EPLB greedy when its replicas sit on distinct GPUs, else LPT or trivial) with the analytic bound, "
               "not searched; the command may end after the limit")
    budget.note_cut("expert placement layer search (the time was used up before it began)")


class _LayerProgress:
    """``--progress`` rows of the layer search: one per finished layer (the layer's max load,
    bound and gap, in tokens), at most every :data:`THROTTLE_S` seconds with the last held row
    shown before the final ``done`` row (the worst gap over the layers)."""

    THROTTLE_S = 0.5

    def __init__(self, sink: ProgressSink, budget: Budget, layers: int):
        self.sink, self.budget, self.layers = sink, budget, layers
        self.last = -math.inf
        self.held: dict | None = None

    def layer(self, out: LayerOutcome, done: int) -> None:
        now = time.perf_counter()
        row = {"elapsed_s": self.budget.elapsed_s(), "method": f"layer {out.layer} ({out.mode}), {done}/{self.layers} done",
               "value": out.max_load, "bound": out.bound, "gap": out.gap}
        if now - self.last < self.THROTTLE_S:
            self.held = row
            return
        self.held, self.last = None, now
        self.sink(row)

    def done(self, solution: "ExpertsSolution") -> None:
        if self.held is not None:
            self.sink(self.held)
        proven = sum(o.proven for o in solution.layers)
        self.sink({"elapsed_s": self.budget.elapsed_s(),
                   "method": f"done: {solution.status.value}, {proven}/{self.layers} layers optimal, worst gap",
                   "value": None, "bound": None, "gap": max((o.gap for o in solution.layers), default=None)})


def previous_plans(data: ExpertsData) -> list[LayerPlan] | None:
    """The previous placement of every layer as even-split plans, None without one."""
    if data.previous is None:
        return None
    return [plan_from_phy2log(data.previous[i], data.trace.num_experts, data.slots) for i in range(data.trace.num_layers)]


def score_plan(data: ExpertsData, layer: int, plan: LayerPlan, reference: LayerPlan | None) -> "PlanScore":
    """Scores of one layer's plan on the fitted windows (and the held-out ones), moves counted
    against ``reference``; ``bound`` and ``gap`` are left None (they belong to the solve)."""
    from optimizer.experts.report import PlanScore

    w = data.fit[layer]
    ld = plan.loads(w)
    win = data.windows
    ev = held_out_scores(plan, data.trace.loads[:, layer, :], win.evaluate) if win.evaluate else None
    return PlanScore(max_load=float(ld.max()), mean_load=float(ld.mean()), balancedness=balancedness(ld),
                     bound=None, gap=None, moves=moves(plan, reference),
                     cross_node_tokens=cross_node_tokens(plan, w, np.array(data.node_of), data.num_nodes),
                     evaluation=ev)


def evaluate(data: ExpertsData, plan: ExpertsPlan) -> tuple["PlanScore", ...]:
    """The independent scores of ``plan``, layer by layer (moves against the previous placement,
    or the trivial layout without one); bounds and gaps are not the plan's and stay None."""
    prev = previous_plans(data)
    trivial = trivial_plan(data.trace.num_experts, data.slots)
    return tuple(score_plan(data, i, lp, prev[i] if prev is not None else trivial) for i, lp in enumerate(plan.layers))


@dataclass(frozen=True)
class ExpertsExplanation:
    """The optimised plan against the trivial layout and the greedy EPLB plan, per layer, or why
    there is no plan.

    Attributes:
        rows: per layer: the three plans' scores (``optimized`` with the solve's bound and gap;
            ``trivial`` and ``greedy`` with the gap to that bound, None for a co-located plan).
        moves_from: what moves are counted against.
        conflict_detail: one sentence on the conflicting constraints (infeasible).
    """

    rows: tuple[Any, ...] = ()
    moves_from: str = "trivial placement"
    conflict_detail: str = ""


def explain(data: ExpertsData, solution: ExpertsSolution, budget: Budget) -> ExpertsExplanation:
    """Score the trivial, greedy and optimised plans of every layer on the same windows (no
    solve: ``budget`` is not used)."""
    from optimizer.experts.report import LayerRow

    if solution.conflict:
        g = int(np.argmax(data.slots))
        return ExpertsExplanation(conflict_detail=f"GPU {g} has {data.slots[g]} slots but only "
                                                  f"{data.trace.num_experts} experts exist, and replicas of one "
                                                  "expert must sit on distinct GPUs")
    prev = previous_plans(data)
    trivial = trivial_plan(data.trace.num_experts, data.slots)
    rows = []
    for i, o in enumerate(solution.layers):
        ref = prev[i] if prev is not None else trivial

        def with_bound(plan: LayerPlan) -> "PlanScore":
            sc = score_plan(data, i, plan, ref)
            # the bound holds for plans with distinct GPUs only: no gap for a co-located plan
            gap = None if plan.X.max() > 1 else (0.0 if sc.max_load <= 0 else max(0.0, (sc.max_load - o.bound) / sc.max_load))
            return dataclasses.replace(sc, bound=o.bound, gap=gap)

        opt = dataclasses.replace(with_bound(o.plan), gap=o.gap)
        rows.append(LayerRow(layer=i, name=data.trace.layer_names[i], trivial=with_bound(trivial),
                             greedy=with_bound(solution.greedy.layers[i]), optimized=opt, outcome=o))
    return ExpertsExplanation(tuple(rows), "previous_placement" if prev is not None else "trivial placement")
