"""Optimised placement of every layer: exact CP-SAT model for small layers, CP-SAT
large-neighbourhood search for large ones; every written plan keeps the replicas of one
expert on distinct GPUs, and every reported bound is valid for all such plans.

Per layer (layers are independent; they run on a process pool of ``workers`` processes):

1. Start from the best of three plans that keep replicas on distinct GPUs: the trivial layout
   (``r % E``; always distinct because ``slots <= E``), EPLB's greedy plan when it has no
   co-located replicas, and a conflict-aware longest-processing-time packing of the
   apportioned replica counts. Its max load caps ``T`` from above.
2. Phase 1, max load: when the start plan's max load already equals the valid bound (step 4;
   on small equal-slot layers :func:`slot_search` packs every candidate replica-count vector
   exactly, so its plan usually does) there is nothing to search (mode ``start at bound``).
   Otherwise small layers (fewer than ``exact_limit`` Booleans) are solved by the full
   model of :mod:`optimizer.experts.model` with every replica count that can beat the cap.
   Large layers repeat: free the busiest GPU and a few others, solve that sub-problem exactly
   with CP-SAT (counts of experts living only there may change by one), keep the result if the
   busiest GPU got lighter; stop at the analytic bound, when the work is spent, or after a
   run without improvement.
3. Phase 2 (``inter-node`` / ``migration``): the same, with ``T <= (1 + tolerance) x`` the
   phase-1 max load (and never above the greedy max load), optimising node coverage or moves.
4. Bound (tokens, valid for every distinct-GPU plan): the analytic bound
   ``max(total / G, min over counts of the largest load per replica)`` (even split; on small
   layers with equal slots per GPU the exact :func:`slot_bound`) or
   ``max(total / G, largest expert / G)`` (optimised split), or the exact model's bound made
   valid for the real-valued loads (:func:`_valid_bound`) when larger. It is never derived
   from a plan's value. Gap = ``(max load - bound) / max load``; a layer is *optimal* when the
   gap is at most ``OPTIMALITY_REL_TOL`` (1e-6), else *feasible*.
5. EPLB's greedy plan may put two replicas of one expert on one GPU; it stays the comparison
   but is never written; when it beats the optimised plan, the layer's notes say so.

Work, not wall time, limits the search: each CP-SAT solve runs on one worker with a fixed
seed and a deterministic-time limit (``work_limit`` per layer, in CP-SAT deterministic time
units), and the LNS draws from a seeded generator, so two runs give the same plans. The
wall clock is a guard only; a layer it cuts short is flagged not reproducible. The guard of a
layer is its share of the command's :class:`~optimizer.budget.Budget` left when the layer
begins (``LayerTask.budget``, ``share``), so layers that end early leave their time to the
later ones and the last layers end by the budget's deadline; ``time_limit_s`` caps it further.
A layer that begins with less than :data:`MIN_SOLVE_S` left runs no CP-SAT solve at all: it
keeps its start plan and the analytic bound.
"""
from __future__ import annotations

import math
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from objectives.experts import ExpertsObjective
from objectives.experts.max_load import OBJECTIVE as MAX_LOAD
from optimizer.budget import Budget
from optimizer.experts.model import Item, SubProblem, SubResult, build_and_solve, choose_scale
from optimizer.experts.plan import LayerPlan, apportion, plan_from_phy2log, trivial_plan
from optimizer.result import Status

EXACT_LIMIT = 2000
EPS = 1e-9
OPTIMALITY_REL_TOL = 1e-6       # "optimal": (max load - valid bound) / max load <= this
DEFAULT_WORK_PER_LAYER = 1.0    # CP-SAT deterministic time units per layer, at most (default_work)
DEFAULT_WORK_TOTAL = 3.0        # ... and about this much over all the layers of a command
MIN_WORK_PER_LAYER = 0.02


SMALL_LAYER = 2048               # experts x GPUs at or below which a layer gets the full unit


def default_work(layers: int, experts: int, gpus: int) -> float:
    """CP-SAT deterministic time per layer when the instance gives none, by layer size: a small
    layer (experts x GPUs <= 2,048, e.g. 64 experts on 32 GPUs) gets 1 unit (it usually stops
    early with a proof); a larger one a share of 3 units over the layers, between 0.02 and 1.
    Measured on the 2-core machine (58 DeepSeek-V3-shaped layers of 256 experts onto 32 GPUs x 9
    slots, ``benchmarks/bench_experts.py``): 1 unit per layer took 68 s for a mean gap of 0.005%;
    0.1 took 7.9 s (0.34%), 0.03 took 2.9 s (0.42%): past a few hundredths of a unit a large
    layer's gap barely moves while the time grows linearly."""
    if experts * gpus <= SMALL_LAYER:
        return DEFAULT_WORK_PER_LAYER
    return min(DEFAULT_WORK_PER_LAYER, max(MIN_WORK_PER_LAYER, DEFAULT_WORK_TOTAL / max(1, layers)))
SUB_WORK = 0.02                 # deterministic time of one LNS sub-solve
MIN_SOLVE_S = 0.005             # a solve begun with less wall time left than this is not begun


@dataclass
class LayerTask:
    layer: int
    w: np.ndarray                 # [E] int tokens (fitted windows)
    slots: list[int]
    node_of: list[int]
    num_nodes: int
    split: str                    # even | optimal
    objective: ExpertsObjective   # objectives/experts/
    greedy: LayerPlan
    prev: np.ndarray | None       # [E, G] previous replica counts
    move_weight: float            # tokens per move
    tolerance: float
    time_limit_s: float | None    # wall-clock guard for this layer, s from its start (None: none)
    exact_limit: int = EXACT_LIMIT
    seed: int = 0
    work_limit: float = DEFAULT_WORK_PER_LAYER   # CP-SAT deterministic time for this layer
    budget: Budget | None = None  # the command's budget: the layer's guard is its share of what is left
    share: float = 1.0            # that share (0-1) of the budget's time left when the layer begins

    def deadline(self, now: float) -> float | None:
        """The layer's wall-clock guard, ``time.perf_counter()`` seconds (None: no guard): the
        earlier of ``time_limit_s`` from ``now`` and the budget's share. perf_counter is the
        system-wide monotonic clock on Linux, so a deadline set in the parent holds in a forked
        worker."""
        ends = []
        if self.time_limit_s is not None:
            ends.append(now + self.time_limit_s)
        if self.budget is not None and self.budget.limited:
            ends.append(self.budget.split(self.share).deadline)
        return min(ends) if ends else None


@dataclass(frozen=True)
class LayerOutcome:
    layer: int
    plan: LayerPlan
    max_load: float
    bound: float
    gap: float
    proven: bool
    status: Status
    mode: str                     # exact | exact+lns | lns | start at bound (phase 1 needed no search)
    greedy_colocated: bool        # EPLB's plan puts two replicas of one expert on one GPU
    time_s: float
    solves: int
    phase2_status: str | None = None
    notes: list[str] = field(default_factory=list)
    work: float = 0.0             # CP-SAT deterministic time spent
    reproducible: bool = True     # False when the wall-clock guard stopped a solve


# ------------------------------------------------------------------ bounds and starts

def analytic_bound(w: np.ndarray, slots: list[int], split: str) -> float:
    """Lower bound on the max GPU load (tokens) of any plan; see module docstring."""
    G = len(slots)
    R = int(sum(slots))
    total = float(np.sum(w))
    if split == "optimal":
        return max(total / G, float(np.max(w)) / G)
    c = apportion(w, R, G)
    return max(total / G, float(np.max(w / c)))


SLOT_BOUND_COUNTS = 200_000  # replica-count vectors the slot bound enumerates at most


def slot_bound(w: np.ndarray, slots: list[int]) -> float | None:
    """Even split, every GPU with the same ``s`` slots: a lower bound on the max GPU load (tokens)
    of any plan (:func:`slot_search`); None when it does not apply."""
    found = slot_search(w, slots)
    return None if found is None else found[0]


SLOT_SEARCH_STATES = 200_000  # calls of the exact per-vector packing search, in all (about 1 s)


def slot_search(w: np.ndarray, slots: list[int]) -> tuple[float, list[int] | None] | None:
    """Even split, every GPU with the same ``s`` slots: ``(bound, phy2log row or None)`` over
    every replica-count vector ``c`` (``1 <= c_e <= G``, ``sum c = R``); None when the GPUs'
    slots differ or there are more than :data:`SLOT_BOUND_COUNTS` vectors.

    Every slot holds a replica (``sum c = R``), so each GPU carries exactly ``s`` of the ``R``
    per-replica loads ``a_e = w_e / c_e``. Per vector, a lower bound on its best packing:
    ``a_0`` (s = 1); ``max_i a_i + a_{R-1-i}`` over the G pairs of the sorted loads (s = 2:
    largest with smallest is optimal for two items per machine when replicas of one expert
    may share a GPU, so it bounds the distinct-GPU packings from below); ``a_0 + the s - 1
    smallest`` (s >= 3); and always ``sum w / G``.

    Vectors are then taken in increasing order of that bound and packed exactly
    (:func:`_best_packing`: the min over distinct-expert packings of the busiest GPU) until
    the next vector's bound reaches the best packing found; a vector whose exact packing would
    exceed the :data:`SLOT_SEARCH_STATES` budget keeps its lower bound. The bound returned is
    the least of the best packing and those lower bounds, so it is valid for every plan that
    keeps one expert's replicas on distinct GPUs, and equals the optimum when nothing was cut:
    the row returned (GPU ``i`` holds entries ``i*s .. i*s+s-1``) is then an optimal plan.
    DeepSeek EPLB's README layer (12 experts, 16 slots on 8 GPUs) has 1,365 vectors, optimum
    136 tokens."""
    G, R = len(slots), int(sum(slots))
    if len(set(slots)) != 1:
        return None
    s, E = int(slots[0]), len(w)
    if E > R or math.comb(R - 1, E - 1) > SLOT_BOUND_COUNTS:
        return None
    avg = float(np.sum(w)) / G
    wf = [float(x) for x in w]
    vectors: list[tuple[float, tuple[int, ...]]] = []
    c = [1] * E

    def leaf() -> None:
        a = sorted((wf[e] / c[e] for e in range(E) for _ in range(c[e])), reverse=True)
        if s == 1:
            t = a[0]
        elif s == 2:
            t = max(a[i] + a[R - 1 - i] for i in range(G))
        else:
            t = a[0] + sum(a[R - s + 1:])
        vectors.append((max(t, avg), tuple(c)))

    def rec(e: int, left: int) -> None:
        if e == E - 1:
            if 1 + left <= G:
                c[e] = 1 + left
                leaf()
            return
        for extra in range(0, min(left, G - 1) + 1):
            c[e] = 1 + extra
            rec(e + 1, left - extra)
        c[e] = 1

    rec(0, R - E)
    if not vectors:
        return None
    vectors.sort()
    best, row, unresolved = math.inf, None, math.inf
    budget = [SLOT_SEARCH_STATES]
    for t, cv in vectors:
        if t >= best or t >= unresolved:
            break
        found = _best_packing([wf[e] / cv[e] for e in range(E)], list(cv), s, budget)
        if found is None:
            unresolved = min(unresolved, t)
            continue
        if found[0] < best:
            best, row = found
    bound = min(best, unresolved)
    return bound, row


def _best_packing(a: list[float], counts: list[int], s: int, budget: list[int]):
    """Exact: the least max GPU load over packings of ``counts[e]`` replicas of load ``a[e]``
    into GPUs of ``s`` slots each, no GPU holding two replicas of one expert;
    ``(max load, phy2log row)``, or None when no such packing exists or the search would
    visit more states than ``budget[0]`` (decremented by the states visited).

    Replicas of one expert are interchangeable, so a state is the vector of replicas left per
    expert; the GPU filled next always holds a replica of the heaviest expert left (every
    replica must go somewhere, so this loses no packing), with ``s - 1`` replicas of distinct
    other experts; memoised over states."""
    from itertools import combinations

    order = sorted(range(len(a)), key=lambda e: (-a[e], e))
    memo: dict[tuple[int, ...], tuple[float, tuple] | None] = {}

    def f(left: tuple[int, ...]):
        # every call is charged, memo hits included: with s slots a state tries up to
        # C(E-1, s-1) groups, so counting new states alone let one 12-expert layer of 4-slot
        # GPUs take 8 million calls (12 s)
        if budget[0] <= 0:
            raise _OutOfStates
        budget[0] -= 1
        if left in memo:
            return memo[left]
        live = [e for e in order if left[e] > 0]
        if not live:
            return 0.0, ()
        top, others = live[0], live[1:]
        best = None
        for group in combinations(others, s - 1):
            nxt = list(left)
            nxt[top] -= 1
            for e in group:
                nxt[e] -= 1
            sub = f(tuple(nxt))
            if sub is None:
                continue
            load = a[top] + sum(a[e] for e in group)
            val = max(load, sub[0])
            if best is None or val < best[0]:
                best = (val, ((top, *group),) + sub[1])
        memo[left] = best
        return best

    try:
        out = f(tuple(counts))
    except _OutOfStates:
        return None
    if out is None:
        return None
    return out[0], [e for gpu in out[1] for e in gpu]


class _OutOfStates(Exception):
    """The exact packing search ran out of its state budget."""


def lpt_plan(w: np.ndarray, counts: np.ndarray, slots: list[int]) -> LayerPlan | None:
    """Heaviest replica first onto the lightest GPU with a free slot and no replica of it."""
    E, G = len(w), len(slots)
    X = np.zeros((E, G), dtype=np.int64)
    load = np.zeros(G)
    used = np.zeros(G, dtype=np.int64)
    cap = np.asarray(slots)
    per = w / counts
    order = sorted(((per[e], e) for e in range(E) for _ in range(int(counts[e]))), key=lambda t: (-t[0], t[1]))
    for i, (v, e) in enumerate(order):
        ok = (used < cap) & (X[e] == 0)
        if not ok.any():
            return None
        # a GPU that must take every remaining item keeps room: prefer lightest feasible
        cand = np.flatnonzero(ok)
        g = int(cand[np.argmin(load[cand])])
        X[e, g] = 1
        load[g] += v
        used[g] += 1
    return LayerPlan.even(X)


# ------------------------------------------------------------------ state for the search

class _State:
    """Current plan of one layer in load units (even split: per-replica units by count)."""

    def __init__(self, task: LayerTask, plan: LayerPlan, scale: float, deadline: float | None = None):
        self.t = task
        self.scale = scale
        self.deadline = deadline
        self.work = 0.0
        self.solves = 0
        self.wall_stopped = False
        self.X = (plan.X > 0).astype(np.int64)
        self.E, self.G = self.X.shape
        if task.split == "optimal":
            # shares in load units; scale is an integer for the optimised split
            self.w_units = np.rint(np.asarray(task.w, dtype=np.float64) * scale).astype(np.int64)
            self.S = _integer_shares(self.w_units, plan)
        self.refresh()

    def out_of_time(self) -> bool:
        if self.deadline is not None and time.perf_counter() >= self.deadline - MIN_SOLVE_S:
            self.wall_stopped = True
        return self.wall_stopped

    def solve(self, sp: SubProblem, work: float):
        """One deterministic CP-SAT solve charged to this layer's work; an empty result, without
        building the model, once the wall-clock guard is (nearly) reached."""
        if self.out_of_time():
            return SubResult(Status.TIME_LIMIT, X={}, shares={}, T=None, objective=None, bound=None, time_s=0.0,
                             wall_stopped=True)
        wall = None if self.deadline is None else max(0.001, self.deadline - time.perf_counter())
        res = build_and_solve(sp, max(1e-4, work), wall, seed=self.t.seed)
        self.work += res.work
        self.solves += 1
        self.wall_stopped |= res.wall_stopped
        return res

    def unit(self, e: int, k: int) -> int:
        return int(round(self.t.w[e] * self.scale / k))

    def refresh(self) -> None:
        if self.t.split == "even":
            c = self.X.sum(axis=1)
            per = np.array([self.unit(e, int(c[e])) for e in range(self.E)], dtype=np.int64)
            self.load = (self.X * per[:, None]).sum(axis=0)
        else:
            self.load = self.S.sum(axis=0)

    def plan(self) -> LayerPlan:
        if self.t.split == "even":
            return LayerPlan.even(self.X)
        w = self.w_units.astype(np.float64)
        F = np.where(w[:, None] > 0, self.S / np.maximum(w[:, None], 1), self.X / np.maximum(self.X.sum(1, keepdims=True), 1))
        return LayerPlan(self.X.copy(), F)

    def moves(self) -> int:
        return 0 if self.t.prev is None else int(((self.X > 0) & (self.t.prev == 0)).sum())

    def covered(self) -> np.ndarray:
        cov = np.zeros((self.E, self.t.num_nodes), dtype=bool)
        for g, n in enumerate(self.t.node_of):
            cov[:, n] |= self.X[:, g] > 0
        return cov


def _integer_shares(w: np.ndarray, plan: LayerPlan) -> np.ndarray:
    """Whole-token shares close to ``w * F`` that add up to ``w`` per expert."""
    raw = w[:, None] * plan.F
    S = np.floor(raw).astype(np.int64)
    for e in range(len(w)):
        rest = int(w[e] - S[e].sum())
        if rest:
            order = np.argsort(-(raw[e] - S[e]) - (plan.X[e] > 0) * 1.0, kind="stable")
            for g in order[:rest]:
                S[e, g] += 1
    return S


# ------------------------------------------------------------------ sub-problem construction

def _items(st: _State, gpus: list[int], whole: bool, k_options: str) -> list[Item]:
    t = st.t
    gset = set(gpus)
    items = []
    cov = st.covered() if t.objective.covers_nodes else None
    for e in range(st.E):
        inside = [g for g in gpus if st.X[e, g]]
        total = int(st.X[e].sum())
        if not inside and not whole:
            continue
        outside_nodes = frozenset()
        if cov is not None:
            outside_nodes = frozenset(t.node_of[g] for g in range(st.G) if st.X[e, g] and g not in gset)
        cw = int(round(t.w[e] * st.scale / t.num_nodes)) if t.objective.covers_nodes else 0
        it = Item(e=e, covered_outside=outside_nodes, cover_weight=cw, current_gpus=tuple(inside))
        if t.split == "even":
            if len(inside) == total:  # lives only here: its count may change
                if k_options == "all":
                    ks = range(st.lo[e], st.hi[e] + 1)
                else:
                    ks = range(max(st.lo[e], total - 1), min(total + 1, len(gpus), st.hi[e]) + 1)
                it.options = [(k, st.unit(e, k)) for k in ks]
            else:
                it.options = [(len(inside), st.unit(e, total))]
        else:
            it.amount = int(st.S[e, gpus].sum())
            it.min_inside = 1 if (len(inside) == total or it.amount > 0) else 0
            it.max_inside = len(gpus)
            it.current_shares = {g: int(st.S[e, g]) for g in gpus if st.X[e, g]}
        items.append(it)
    return items


def _apply(st: _State, gpus: list[int], res) -> None:
    for g in gpus:
        st.X[:, g] = 0
        if st.t.split == "optimal":
            st.S[:, g] = 0
    for (e, g) in res.X:
        st.X[e, g] = 1
    if st.t.split == "optimal":
        for (e, g), v in res.shares.items():
            st.S[e, g] = v
    st.refresh()


def _sub(st: _State, gpus: list[int], objective: ExpertsObjective, cap: int, whole: bool, k_options: str) -> SubProblem:
    t = st.t
    return SubProblem(layer=t.layer, gpus=gpus, slots=[t.slots[g] for g in gpus],
                      node_of=[t.node_of[g] for g in gpus], items=_items(st, gpus, whole, k_options),
                      split=t.split, objective=objective, cap=cap, prev=t.prev,
                      move_weight=int(round(t.move_weight * st.scale)) if objective.balances_load else 0)


# ------------------------------------------------------------------ the per-layer solve

def solve_layer(t: LayerTask) -> LayerOutcome:
    """Optimised plan of one layer, its valid lower bound, gap and status (module docstring).

    Deterministic for a given task (fixed work limits, one CP-SAT worker, seeded LNS) unless
    the wall-clock guard (:meth:`LayerTask.deadline`) stops a solve first; then ``reproducible``
    is False.
    """
    t0 = time.perf_counter()
    deadline = t.deadline(t0)
    w = np.asarray(t.w, dtype=np.int64)
    E, G, R = len(w), len(t.slots), int(sum(t.slots))
    notes: list[str] = []
    greedy_loads = t.greedy.loads(w)
    greedy_max = float(greedy_loads.max())
    greedy_colocated = bool(t.greedy.X.max() > 1)
    lb = analytic_bound(w, t.slots, t.split)
    paired = None
    if t.split == "even":
        found = slot_search(w, t.slots)
        if found is not None:
            lb = max(lb, found[0])
            if found[1] is not None:
                paired = plan_from_phy2log(found[1], E, t.slots)

    # every start keeps replicas of one expert on distinct GPUs (the trivial layout always does)
    starts = [trivial_plan(E, t.slots)]
    if not greedy_colocated:
        starts.append(t.greedy)
    lp = lpt_plan(w.astype(np.float64), apportion(w, R, G), t.slots)
    if lp is not None:
        starts.append(lp)
    if paired is not None:  # the slot search's pairing (small equal-slot layers)
        starts.append(paired)
    start = min(starts, key=lambda p: float(p.loads(w).max()))
    if t.objective.starts_from_previous() and t.prev is not None and t.prev.max() <= 1 and (t.prev.sum(1) >= 1).all():
        start = LayerPlan.even(t.prev)  # the max-load phase then moves few replicas from where they are
    start_max = float(start.loads(w).max())

    kmax = min(G, R - E + 1)
    scale, exact_units = choose_scale(float(w.sum()), kmax, t.split, G)
    st = _State(t, start, scale, deadline)
    lb_units = lb * scale

    # replica-count options that can still beat the start plan
    lo = np.maximum(1, np.ceil(w / max(start_max, EPS) - EPS)).astype(np.int64)
    spare = R - int(lo.sum())
    st.lo = lo
    st.hi = np.minimum(G, lo + max(spare, 0))
    n_vars = int((st.hi - st.lo + 1).sum() * G) if t.split == "even" else 2 * E * G
    mode = "exact" if n_vars <= t.exact_limit else "lns"
    solver_bound = None
    phase1_obj = MAX_LOAD
    two_phase = not t.objective.balances_load
    phase1_work = t.work_limit * (0.5 if two_phase else 1.0)

    small = mode == "exact"
    if start_max <= lb * (1 + OPTIMALITY_REL_TOL) and (t.prev is None or t.move_weight == 0):
        mode = "start at bound"  # the start plan meets the valid bound (e.g. the slot search's exact packing): phase 1 is proven
    elif mode == "exact":
        symmetric = t.prev is None and len(set(t.slots)) == 1
        if symmetric:  # order the start plan's GPUs by load so the hint respects symmetry breaking
            perm = np.argsort(-st.load, kind="stable")
            st.X = st.X[:, perm]
            if t.split == "optimal":
                st.S = st.S[:, perm]
            st.refresh()
        cap = int(st.load.max())
        # half the phase's work for the whole-layer model; LNS continues if it is not proven
        sp = _sub(st, list(range(G)), phase1_obj, cap, True, "all")
        sp.symmetric = symmetric
        res = st.solve(sp, 0.5 * phase1_work if t.split == "even" else phase1_work)
        if res.X:
            _apply(st, list(range(G)), res)
        if res.bound is not None and (t.prev is None or t.move_weight == 0):
            solver_bound = _valid_bound(res.bound, scale, exact_units, t)
        if res.status != Status.OPTIMAL and t.split == "even" and (t.prev is None or t.move_weight == 0):
            _lns(st, phase1_obj, int(st.load.max()), phase1_work, lb_units)
            mode = "exact+lns"
    elif mode == "lns":
        _lns(st, phase1_obj, int(st.load.max()), phase1_work, lb_units)

    phase2 = None
    if two_phase:
        t1 = float(st.load.max())
        cap = int(math.floor(min(t1 * (1 + t.tolerance), greedy_max * scale)))
        cap = max(cap, int(st.load.max()))
        prev_ok = (t.objective.starts_from_previous() and t.prev is not None and t.prev.max() <= 1
                   and (t.prev.sum(1) >= 1).all() and (t.prev.sum(0) == np.asarray(t.slots)).all())
        if prev_ok and float(LayerPlan.even(t.prev).loads(w).max()) * scale <= cap + 1e-9:
            # the previous placement already meets the load cap: zero moves, which no plan beats
            st = _State(t, LayerPlan.even(t.prev), scale, deadline)
            phase2 = Status.OPTIMAL.value
            notes.append("the previous placement meets the max-load cap: kept as it is (0 moves)")
        elif small:
            res = st.solve(_sub(st, list(range(G)), t.objective, cap, True, "all"), t.work_limit - st.work)
            if res.X:
                _apply(st, list(range(G)), res)
                phase2 = res.status.value
        else:
            _lns(st, t.objective, cap, t.work_limit, lb_units)
            phase2 = "feasible"

    plan = st.plan()
    if plan.X.max() > 1 or (plan.X.sum(axis=0) != np.asarray(t.slots)).any() or (plan.X.sum(axis=1) < 1).any():
        raise AssertionError(f"layer {t.layer}: optimised plan breaks its own constraints")  # never expected
    mx = float(plan.loads(w).max())
    if greedy_colocated and mx > greedy_max * (1 + 1e-12):
        notes.append(f"greedy places two replicas of one expert on one GPU (not allowed here); its max load "
                     f"{greedy_max:.6g} is below this plan's {mx:.6g}")
    if st.wall_stopped and st.solves == 0:
        notes.append("wall-clock limit reached before the first solve: the start plan with the analytic bound, "
                     "not searched (this layer may differ between runs)")
    elif st.wall_stopped:
        notes.append("wall-clock limit reached before the work limit: this layer may differ between runs")
    return _finish(t, plan, mx, lb, solver_bound, mode, greedy_colocated, t0, st.solves, phase2, notes,
                   st.work, not st.wall_stopped)


def _valid_bound(model_bound: float, scale: float, exact_units: bool, t: LayerTask) -> float:
    """A lower bound in tokens on every plan's max load from the model's bound (units).

    Exact units: ``bound / scale``. Even split with rounded per-replica loads: a GPU's model
    load is within ``slots/2`` units of its true load, so ``(bound - max slots / 2) / scale``.
    Optimised split with a non-exact scale: the integer optimum is at most one unit above the
    real one, so ``(bound - 1) / scale`` (see :mod:`optimizer.experts.model`).
    """
    if exact_units:
        slack = 0.0
    elif t.split == "even":
        slack = max(t.slots) * 0.5
    else:
        slack = 1.0
    return (math.ceil(model_bound - 1e-9) - slack) / scale


def _finish(t, plan, mx, lb, solver_bound, mode, greedy_colocated, t0, solves, phase2, notes, work, reproducible):
    # a bound from a plan's own value is never used: only the analytic and the model's bound
    bound = lb if solver_bound is None else max(lb, solver_bound)
    bound = min(bound, mx)  # both valid; the optimum is at most mx
    gap = 0.0 if mx <= 0 else max(0.0, (mx - bound) / mx)
    proven = gap <= OPTIMALITY_REL_TOL
    if not t.objective.balances_load:
        proven = proven and phase2 == Status.OPTIMAL.value
    status = Status.OPTIMAL if proven else Status.FEASIBLE
    return LayerOutcome(t.layer, plan, mx, bound, gap, proven, status, mode, greedy_colocated,
                        time.perf_counter() - t0, solves, phase2, notes, work, reproducible)


def _lns(st: _State, objective: ExpertsObjective, cap: int, work_end: float, lb_units: float) -> None:
    """Large-neighbourhood search: re-solve small GPU subsets exactly with CP-SAT.

    max-load: the busiest GPU with one partner (lightest first, then the next lighter ones);
    when no partner helps, subsets of three and then four GPUs with random partners (seeded).
    Other objectives: random subsets of ``size`` GPUs. Every accepted step keeps the max load
    at or under ``cap`` (max-load: under the current max), so the search never gets worse.
    Stops when the layer's work reaches ``work_end`` (CP-SAT deterministic time summed over
    sub-solves), at the bound, after a run without improvement, or at the wall-clock guard.
    """
    t = st.t
    rng = np.random.default_rng(t.seed + 7919 * t.layer)
    G = st.G
    fails = 0
    size = 2
    while st.work < work_end - 1e-9 and not st.out_of_time():
        if objective.balances_load:
            if st.load.max() <= math.ceil(lb_units - 1e-9):
                break
            top = np.flatnonzero(st.load == st.load.max())
            first = int(top[0]) if len(top) == 1 else int(rng.choice(top))
            order = [int(g) for g in np.argsort(st.load, kind="stable") if g != first]
            if not order:
                break
            if size == 2:
                if fails >= len(order):
                    size, fails = 3, 0
                    continue
                gpus = sorted({first, order[fails]})
            else:
                if fails >= 3 * G:
                    if size >= min(G, 4):
                        break
                    size, fails = size + 1, 0
                    continue
                gpus = sorted({first, *[int(g) for g in rng.choice(order, size=min(len(order), size - 1), replace=False)]})
        else:
            if fails >= 6 * G:
                break
            gpus = sorted(int(g) for g in rng.choice(G, size=min(G, max(2, size + 1)), replace=False))
        sub_cap = int(st.load[gpus].max()) if objective.balances_load else cap
        sp = _sub(st, gpus, objective, sub_cap, False, "near")
        before = objective.lns_score(st, gpus)
        res = st.solve(sp, min(SUB_WORK, work_end - st.work))
        if not res.X:
            fails += 1
            continue
        saved_X = st.X.copy()
        saved_S = st.S.copy() if t.split == "optimal" else None
        old_max = st.load.max()
        _apply(st, gpus, res)
        after = objective.lns_score(st, gpus)
        limit = old_max if objective.balances_load else max(old_max, cap)
        if st.load.max() > limit or not after < before:
            st.X = saved_X
            if saved_S is not None:
                st.S = saved_S
            st.refresh()
            fails += 1
        else:
            fails = 0
            if objective.balances_load:
                size = 2


# ------------------------------------------------------------------ all layers

def parallel_workers(num_layers: int, num_experts: int, num_gpus: int, workers: int) -> int:
    """Processes used for the layers: several only for several large layers."""
    if num_layers > 1 and workers > 1 and num_experts * num_gpus >= 1024:
        return max(1, min(workers, os.cpu_count() or 1, num_layers))
    return 1


def solve_layers(tasks: list[LayerTask], workers: int = 2,
                 on_layer: Callable[[LayerOutcome, int], None] | None = None) -> list[LayerOutcome]:
    """Solve every layer (in task order); a process pool when :func:`parallel_workers` says so.
    ``on_layer(outcome, layers done)`` is called in this process as each layer ends (progress)."""
    n = parallel_workers(len(tasks), len(tasks[0].w), len(tasks[0].slots), workers) if tasks else 1
    if n == 1:
        outs = []
        for t in tasks:
            outs.append(solve_layer(t))
            if on_layer is not None:
                on_layer(outs[-1], len(outs))
        return outs
    import multiprocessing as mp

    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as ex:
        futures = [ex.submit(solve_layer, t) for t in tasks]  # started in this order (the shares assume it)
        done = 0
        for f in as_completed(futures):
            done += 1
            if on_layer is not None:
                on_layer(f.result(), done)
        return [f.result() for f in futures]
