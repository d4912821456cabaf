"""CP-SAT model of one layer's placement, or of a sub-problem over some of its GPUs.

Decisions (the families of ``constraints/experts/`` name every constraint; :data:`FAMILIES`
is the formulation, each family's ``define(model, sub_problem)`` adds its constraints to a
:class:`LayerModel`):

* even split: ``z[e,g,k]`` = expert ``e`` has ``k`` replicas here and one of them on GPU ``g``;
  ``y[e,k]`` picks the count (``replica_count``); ``sum_{e,k} z[e,g,k] = slots[g]``
  (``gpu_slots``); ``sum_{e,k} u[e,k] z[e,g,k] <= T`` (``gpu_load``) where ``u[e,k]`` is the
  per-replica load ``w[e]/k`` in load units. Replicas of one expert sit on distinct GPUs
  because ``sum_k z[e,g,k]`` is 0/1.
* optimised split: Booleans ``x[e,g]`` and integer shares ``s[e,g]`` (``token_split``).

Load units: tokens times ``scale`` rounded to the nearest integer; ``scale`` is chosen by
:func:`choose_scale`. Even split: ``lcm(1..max replicas)`` when small, so every per-replica
load ``w/k`` is an exact integer; otherwise about 1e8 units per layer (each per-replica load
rounded by at most 0.5 unit, so a GPU's model load is within ``slots/2`` units of its true
load). Optimised split: ``lcm(1..G)`` when small, which is exact because the optimal max load
of a placement is ``W/k`` for a sum of expert loads ``W`` and a GPU count ``k <= G``
(supply-demand theorem for the transportation problem, Gale 1957), and integer flows attain
it; otherwise an integer scale of about 1e8 units per layer, for which the integer optimum is
at most one unit above the real one (integral max-flow with capacity ``ceil(T*)``).

Solves are deterministic: one CP-SAT worker, a fixed seed, and a *work* limit in CP-SAT
deterministic time units (``max_deterministic_time``); a wall-clock limit is only a guard.

A sub-problem frees the replicas on a subset of GPUs and keeps everything else fixed: experts
whose replicas all sit in the subset may change their count (options given by the caller);
the others keep their count and their per-replica load.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from constraints.experts import load as experts_load
from constraints.experts import locality as experts_locality
from constraints.experts import replicas as experts_replicas
from constraints.experts import slots as experts_slots
from objectives.experts import ExpertsObjective
from optimizer.cpsat import NamedModel, ortools_cp_model
from optimizer.result import Status

if TYPE_CHECKING:  # OR-Tools is imported when a model is built or solved, not with this module
    from ortools.sat.python import cp_model

# the formulation: every constraint family, in the order it is added
FAMILIES = (experts_replicas, experts_slots, experts_load, experts_locality)

LOAD_UNITS_PER_LAYER = 1e8


def _lcm_upto(n: int, total_tokens: float) -> int | None:
    lcm = 1
    for k in range(2, n + 1):
        lcm = lcm * k // math.gcd(lcm, k)
        if lcm * total_tokens > LOAD_UNITS_PER_LAYER:
            return None
    return lcm if lcm * max(total_tokens, 1) <= LOAD_UNITS_PER_LAYER else None


def choose_scale(total_tokens: float, max_count: int, split: str, num_gpus: int = 1) -> tuple[float, bool]:
    """Load units per token, and whether the integer model is then exact.

    Args:
        total_tokens: tokens of the layer (sum of expert loads, integer counts).
        max_count: largest replica count of any expert (even split).
        split: ``even`` or ``optimal``.
        num_gpus: GPUs of the layer (optimised split).
    Returns:
        ``(scale, exact)``. Even split: ``lcm(1..max_count)`` when that keeps the layer
        under 1e8 units (exact: every ``w/k`` is an integer), else ``1e8 / total_tokens``
        (per-replica loads rounded, not exact). Optimised split: ``lcm(1..num_gpus)`` when
        small (exact, see module docstring), else the integer ``floor(1e8 / total)`` (>= 1;
        integer optimum at most one unit above the real one).
    """
    if split == "optimal":
        lcm = _lcm_upto(num_gpus, total_tokens)
        if lcm is not None:
            return float(lcm), True
        return float(max(1, int(LOAD_UNITS_PER_LAYER // max(total_tokens, 1.0)))), False
    lcm = _lcm_upto(max_count, total_tokens)
    if lcm is not None:
        return float(lcm), True
    return LOAD_UNITS_PER_LAYER / max(total_tokens, 1.0), False


@dataclass
class Item:
    """One expert inside a (sub-)problem.

    Attributes:
        e: logical expert id.
        options: even split: ``(replicas here, per-replica load units)`` choices.
        amount: optimised split: load units this expert must place here.
        min_inside: optimised split: replicas it must keep here (1 if it lives only here).
        max_inside: optimised split: at most this many replicas here.
        covered_outside: nodes already hosting the expert outside the sub-problem.
        cover_weight: objective weight of covering one more node (inter-node).
        current: GPUs holding it now (for the hint), and current count option.
    """

    e: int
    options: list[tuple[int, int]] = field(default_factory=list)
    amount: int = 0
    min_inside: int = 0
    max_inside: int = 0
    covered_outside: frozenset = frozenset()
    cover_weight: int = 0
    current_gpus: tuple = ()
    current_shares: dict = field(default_factory=dict)


@dataclass
class SubProblem:
    layer: int
    gpus: list[int]
    slots: list[int]
    node_of: list[int]
    items: list[Item]
    split: str
    objective: ExpertsObjective      # the phase's objective (objectives/experts/)
    cap: int | None = None           # upper bound on every GPU load here (units)
    prev: np.ndarray | None = None   # [experts, gpus] previous X (global GPU index)
    move_weight: int = 0             # load units per move (max-load objective)
    t_lower: int = 0
    symmetric: bool = False          # GPUs interchangeable: order their loads (symmetry breaking)


@dataclass
class SubResult:
    status: Status
    X: dict                 # (e, g) -> 1
    shares: dict            # (e, g) -> units (optimised split)
    T: int | None
    objective: float | None
    bound: float | None
    time_s: float
    work: float = 0.0          # CP-SAT deterministic time spent
    wall_stopped: bool = False  # stopped by the wall-clock guard (not reproducible)


def solve_deterministic(model: cp_model.CpModel, work_limit: float, wall_limit_s: float | None,
                        seed: int = 0):
    """Solve with one worker, a fixed seed and a deterministic-time limit.

    Two solves of the same model with the same ``work_limit`` give the same answer, unless
    ``wall_limit_s`` (a guard) stops the search first.

    Returns:
        ``(status, solver, wall seconds, work used, stopped by the wall guard)``.
    """
    cp_model = ortools_cp_model()
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    solver.parameters.max_deterministic_time = max(1e-4, float(work_limit))
    if wall_limit_s is not None:
        solver.parameters.max_time_in_seconds = max(0.001, float(wall_limit_s))
    t0 = time.perf_counter()
    code = solver.solve(model)
    dt = time.perf_counter() - t0
    st = {cp_model.OPTIMAL: Status.OPTIMAL, cp_model.FEASIBLE: Status.FEASIBLE,
          cp_model.INFEASIBLE: Status.INFEASIBLE}.get(code, Status.TIME_LIMIT)
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT model invalid: {model.validate()}")
    work = float(solver.deterministic_time)
    wall_stopped = (wall_limit_s is not None and code not in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
                    and work < solver.parameters.max_deterministic_time * 0.999 and dt >= 0.9 * wall_limit_s)
    return st, solver, dt, work, wall_stopped


@dataclass
class LayerModel:
    """The CP-SAT model of one (sub-)problem: what the constraint families define and the
    objective is set on. Loads are in load units (module docstring).

    Attributes:
        named: the model with its named constraints.
        T: the max-load variable.
        z, y: even split: ``z[e][k][g]`` (expert e has k replicas here, one on GPU g) and
            ``y[e][k]`` (count option k chosen; the constant 1 with one option).
        x, s: optimised split: ``x[e][g]`` (a replica of e on g) and its integer share ``s[e][g]``.
        placed: ``(e, g) -> 0/1 expression``: a replica of e on GPU g.
        load_terms: ``g -> [(units, variable)]``: the load on GPU g.
        slot_terms: ``g -> [variable]``: the replicas on GPU g.
        loads: ``g -> load expression`` (set by the ``gpu_load`` family).
        cover_terms: ``[(weight, u[e, n])]`` (set by the ``node_cover`` family).
    """

    named: NamedModel
    T: object
    z: dict = field(default_factory=dict)
    y: dict = field(default_factory=dict)
    x: dict = field(default_factory=dict)
    s: dict = field(default_factory=dict)
    placed: dict = field(default_factory=dict)
    load_terms: dict = field(default_factory=dict)
    slot_terms: dict = field(default_factory=dict)
    loads: dict = field(default_factory=dict)
    cover_terms: list = field(default_factory=list)

    @property
    def cp(self) -> cp_model.CpModel:
        """The OR-Tools model."""
        return self.named.model

    def add(self, key, constraint):
        """Add ``constraint`` under ``key`` (see :meth:`optimizer.cpsat.NamedModel.add`)."""
        return self.named.add(key, constraint)


def build(sp: SubProblem, hint: bool = True) -> tuple[LayerModel, list[tuple[object, int]]]:
    """The model of ``sp``: variables, every family of :data:`FAMILIES`, the symmetry breaking
    and the objective; returns it with the solution hints (variable, value) of the current plan.

    Raises:
        ValueError: a count option of 0 next to others; the objective needs a previous
            placement and ``sp.prev`` is None.
    """
    nm = NamedModel()
    m = nm.model
    G = sp.gpus
    cap_hi = sp.cap if sp.cap is not None else _total_units(sp)
    model = LayerModel(nm, m.new_int_var(min(sp.t_lower, cap_hi), cap_hi, "T"),
                       load_terms={g: [] for g in G}, slot_terms={g: [] for g in G})
    hints: list[tuple[object, int]] = []
    for it in sp.items:
        if sp.split == "even":
            z: dict[int, dict[int, cp_model.IntVar]] = {}
            y: dict[int, object] = {}
            cur_k = len(it.current_gpus)
            for k, units in it.options:
                if k == 0:
                    continue
                z[k] = {g: m.new_bool_var(f"z[{it.e},{g},{k}]") for g in G}
                y[k] = m.new_bool_var(f"y[{it.e},{k}]") if len(it.options) > 1 else 1
                for g in G:
                    model.load_terms[g].append((units, z[k][g]))
                    model.slot_terms[g].append(z[k][g])
                    if hint:
                        hints.append((z[k][g], int(k == cur_k and g in it.current_gpus)))
                if hint and not isinstance(y[k], int):
                    hints.append((y[k], int(k == cur_k)))
            if len(it.options) > 1 and any(k == 0 for k, _ in it.options):
                raise ValueError("a count option of 0 must be the only option")
            model.z[it.e], model.y[it.e] = z, y
            for g in G:
                terms = [z[k][g] for k in z]
                if terms:
                    model.placed[it.e, g] = sum(terms)
        else:
            x = {g: m.new_bool_var(f"x[{it.e},{g}]") for g in G}
            s = {g: m.new_int_var(0, it.amount, f"s[{it.e},{g}]") for g in G}
            model.x[it.e], model.s[it.e] = x, s
            for g in G:
                model.load_terms[g].append((1, s[g]))
                model.slot_terms[g].append(x[g])
                model.placed[it.e, g] = x[g]
                if hint:
                    hints.append((x[g], int(g in it.current_gpus)))
                    hints.append((s[g], int(it.current_shares.get(g, 0))))
    for family in FAMILIES:
        family.define(model, sp)
    if sp.symmetric:
        # interchangeable GPUs (same slots, objective blind to GPU identity): loads non-increasing
        for a, b, sa, sb in zip(G, G[1:], sp.slots, sp.slots[1:]):
            if sa == sb:
                m.add(model.loads[a] >= model.loads[b])
    moves_expr = None
    if sp.prev is not None:
        moved = [v for (e, g), v in model.placed.items() if sp.prev[e, g] == 0]
        moves_expr = sum(moved) if moved else 0
    sp.objective.set_objective(m, model.T, moves_expr, sp.move_weight, model.cover_terms)
    return model, hints


def build_and_solve(sp: SubProblem, work_limit: float, wall_limit_s: float | None = None,
                    hint: bool = True, seed: int = 0) -> SubResult:
    """Build the CP-SAT model of ``sp`` (:func:`build`) and solve it (deterministically, see
    :func:`solve_deterministic`).

    Args:
        work_limit: CP-SAT deterministic time for this solve.
        wall_limit_s: wall-clock guard (None: none).
    Returns:
        SubResult with the chosen replicas, shares, the max load ``T`` (units) and the
        objective value and bound in model units.
    """
    model, hints = build(sp, hint)
    m = model.cp
    for var, val in hints:
        m.add_hint(var, val)
    if hint and hints:
        m.add_hint(model.T, _hint_max(sp))
    status, sol, dt, work, wall_stopped = solve_deterministic(m, work_limit, wall_limit_s, seed)
    if status not in (Status.OPTIMAL, Status.FEASIBLE):
        return SubResult(status, {}, {}, None, None, None, dt, work, wall_stopped)
    X = {}
    for (e, g), expr in model.placed.items():
        if sol.value(expr):
            X[e, g] = 1
    shares = {(e, g): v for e, sv in model.s.items() for g, v in sv.items()}
    sh = {k: int(sol.value(v)) for k, v in shares.items() if (k in X)}
    return SubResult(status, X, sh, int(sol.value(model.T)), float(sol.objective_value),
                     float(sol.best_objective_bound), dt, work, wall_stopped)


def _hint_max(sp: SubProblem) -> int:
    load = {g: 0 for g in sp.gpus}
    for it in sp.items:
        if sp.split == "even":
            units = dict(it.options).get(len(it.current_gpus), 0)
            for g in it.current_gpus:
                load[g] += units
        else:
            for g, v in it.current_shares.items():
                load[g] += v
    return max(load.values()) if load else 0


def _total_units(sp: SubProblem) -> int:
    if sp.split == "even":
        return int(sum(max(k * u for k, u in it.options) for it in sp.items)) + 1
    return int(sum(it.amount for it in sp.items)) + 1
