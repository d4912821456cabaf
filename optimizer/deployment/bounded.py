"""The bounded column search: batched columns valued by lower bounds first, simulated only when
a master problem chooses them (lazy exactness), so claims hold over every admission order.

A *column* is (layout L, multiset S of session classes) that fits one replica's memory. Its
true value over the decision space (every batch limit and admission order) is a Pareto set of
(makespan, on-time count, finish sum) points, which only a search over schedules gives. Instead
of simulating every column (330,000 for 8 classes of 2 sessions on ten layouts), each column
first gets an *optimistic* point that no schedule of it beats:

* **makespan** ≥ ``Σ_k g[c_k] + kv_rate · Σ_i Σ_j (ctx_i + j + 1) / dp`` and ≥ every session's
  time alone, with ``g`` the concave step floor of the shared model
  (:meth:`optimizer.model.perf.PerfModel.decode_step_floor`: ``step(A) ≥ g[|A|] + kv_rate ·
  Σ(s_i+1)/dp``) and ``c`` the conjugate of the sessions' new-token counts (``c_k`` = sessions
  with more than k tokens to decode). A run is a 0/1 matrix (sessions x steps) whose row sums
  are the new-token counts; by the Gale-Ryser theorem its column sums (the batch of each step)
  are majorised by ``c``, and a sum of a concave ``g`` with ``g[0] = 0`` is Schur-concave
  (Karamata), so no run has a smaller ``Σ g``; the KV read of a run is the same for every order.
  With a batch limit b, the batch vector is also majorised by the water-filled ``min(b, ...)``
  vector (:func:`capped_conjugate`), which bounds each b.
* **on time**: sessions whose deadline is at least the makespan threshold of the search
  ``T_max`` finish on time whenever the replica ends by ``T_max``; for the others (*at risk*) a
  set U can be on time only if, at each of its deadlines d, the sessions of U due by d fit the
  same bound by d (steps with other sessions only add time) and each alone by its own
  deadline. The largest such U (an exact search over the at-risk sub-multisets) bounds the
  on-time count.

The configuration search (:class:`~optimizer.deployment.configurations.ConfigurationSearch`)
over these points gives a bound valid for every plan. The columns of its plan are then
*resolved*: simulated with every batch limit and admission order that can matter (the run
with every session from the start; for one DP rank, orders differing only inside the first
batch are one schedule; batch limits whose bound exceeds ``T_max`` are skipped), replacing the
optimistic point by the exact Pareto points. The search repeats until its plan uses resolved
columns only: that plan is optimal over the whole decision space. A column too large to
resolve within :data:`RESOLVE_WORK` simulations keeps its optimistic point (plus the points
its simulated schedules reached); when the search keeps choosing it, the result is the best
realised plan with the last bound and its gap.

Applies to the threshold objectives (cost, makespan, energy) without faults, with one batch per
decode step (``micro_batches: 1``). Units: seconds in the bounds, ticks of 10 ns in the columns
(loads rounded up, deadlines down, as :mod:`optimizer.deployment.units`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Optional

import numpy as np

from optimizer.deployment.batching import BatchConfiguration, distinct_orders, pareto, simulate
from optimizer.deployment.configurations import ConfigurationSearch
from optimizer.deployment.params import LayoutOption
from optimizer.deployment.schema import Problem
from optimizer.deployment.units import TIME_UNIT_S, ticks_down, ticks_up
from optimizer.model.layout import Layout

DEBUG = False
RESOLVE_WORK = 200_000  # simulated segments one column's order search may take to be exact
MAX_COLUMNS = 400_000  # optimistic columns of one enumeration (beyond: not applied)
SLACK = 1e-9  # bounds are lowered by this share: float rounding never makes one exceed a run
RISK_TUPLES = 256  # at-risk sub-multisets given joint bounds (beyond: each at-risk session alone)


def capped_conjugate(news: np.ndarray, cap: int) -> np.ndarray:
    """The batch vector of the run that decodes sessions with ``news`` tokens left in the
    fewest, fullest steps under a batch limit ``cap``: partial sums ``min(Σ_{j≤k} c_j, k·cap)``
    with ``c`` the conjugate of ``news`` (every feasible batch vector, sorted, is majorised by it)."""
    news = np.sort(np.asarray(news, dtype=np.int64))[::-1]
    if news.size == 0:
        return np.zeros(0, dtype=np.int64)
    steps = np.arange(int(news[0]))
    conj = (news[None, :] > steps[:, None]).sum(axis=1)
    if cap >= news.size:
        return conj
    total = int(news.sum())
    k = np.arange(1, -(-total // cap) + 1)
    cum = np.cumsum(conj)
    cum_full = np.concatenate((cum, np.full(max(0, k.size - cum.size), total)))[:k.size] if k.size > cum.size \
        else cum[:k.size]
    part = np.minimum(cum_full, k * cap)
    part[-1] = total
    out = np.diff(np.concatenate(([0], part)))
    return out[out > 0]


@dataclass
class LayoutBounds:
    """Per layout: the step floor and per-class constants (seconds)."""

    layout: Layout
    option: LayoutOption
    g: np.ndarray  # concave step floor by batch size
    kv_rate: float
    dp: int
    solo: np.ndarray  # per class: the session alone (s)
    kv_run: np.ndarray  # per class: kv_rate · Σ_j (ctx + j + 1), the KV read of its whole run (s)


@dataclass
class ColumnSet:
    """Columns of one layout: counts [M, C] and their optimistic points: point p belongs to
    column ``column[p]`` with makespan bound ``load[p]`` (ticks) and ``on_time[p]`` sessions."""

    counts: np.ndarray
    column: np.ndarray
    load: np.ndarray
    on_time: np.ndarray


@dataclass
class Resolved:
    """A column resolved by simulation: its Pareto points, and whether they cover every schedule."""

    points: list
    exact: bool


@dataclass
class BoundedOutcome:
    """Result of :func:`bounded_search`.

    Attributes:
        counts: [(BatchConfiguration, instances)] of the best realised plan (None: none).
        value: its value in the search's unit (Fraction), or None.
        bound: a bound in the same unit valid for every plan (None: none proven).
        proven: the plan meets the bound.
        infeasible: no plan exists (the optimistic columns already admit none).
        columns, resolved, rounds: optimistic columns, columns simulated, master searches.
        notes: what the search did.
    """

    counts: Optional[list]
    value: Optional[Fraction]
    bound: Optional[Fraction]
    proven: bool
    infeasible: bool = False
    columns: int = 0
    resolved: int = 0
    rounds: int = 0
    solves: int = 0
    simulated: int = 0
    dp_s: float = 0.0
    resolve_s: float = 0.0
    problem: Optional[Problem] = None
    notes: list = field(default_factory=list)


class BoundedColumns:
    """The optimistic columns of a batched problem and their resolution (module docstring).

    Args:
        problem: the problem (no faults).
        perf: its deployment PerfModel.
        options: placeable layouts (:func:`optimizer.deployment.params.layout_options`).
        t_max_s: makespan above which no plan of interest lies (an incumbent's), or None.
    """

    def __init__(self, problem: Problem, perf, options: dict[Layout, LayoutOption], t_max_s: Optional[float] = None):
        self.problem = problem
        self.perf = perf
        self.t_max_s = math.inf if t_max_s is None else float(t_max_s)
        cls = problem.classes
        self.C = len(cls)
        self.ctx = np.array([c.context for c in cls], dtype=np.int64)
        self.new = np.array([c.new for c in cls], dtype=np.int64)
        self.counts_max = np.array([c.count for c in cls], dtype=np.int64)
        self.deadline = np.array([math.inf if c.deadline_s is None else c.deadline_s for c in cls])
        # distinct new-token values: the conjugate is constant between them
        self.levels = np.unique(self.new)
        self.widths = np.diff(np.concatenate(([0], self.levels))).astype(np.float64)
        self.reach = (self.new[:, None] >= self.levels[None, :]).astype(np.int64)  # [C, J]
        positions = self.new * self.ctx + self.new * (self.new + 1) // 2  # Σ_{j<new} (ctx + j + 1)
        cap_total = int(min(problem.batch_cap, len(problem.sessions)))
        self.layouts: dict[Layout, LayoutBounds] = {}
        steps = perf.steps
        for lay, opt in options.items():
            if max(opt.cap, default=0) == 0:
                continue
            most = int(min(len(problem.sessions), sum(opt.cap)))
            floor = steps.decode_step_floor(lay, max(1, most), perf.max_positions)
            if floor is None:
                raise ValueError("bounded columns need one batch per decode step")
            solo = np.array([float(steps.single_session_step_s(lay, np.arange(c.context, c.context + c.new)).sum())
                             for c in cls])
            self.layouts[lay] = LayoutBounds(lay, opt, floor.g, floor.kv_rate, floor.dp, solo,
                                             floor.kv_rate * positions.astype(np.float64))
        self.cap = cap_total
        self.resolved: dict[tuple, Resolved] = {}
        self.sets: dict[Layout, ColumnSet] = {}
        self.simulated = 0

    # ------------------------------------------------------------------ bounds
    def makespan_lb(self, lb: LayoutBounds, counts: np.ndarray) -> np.ndarray:
        """Lower bound (s) of the makespan of each row of ``counts`` [M, C] over every schedule."""
        counts = np.atleast_2d(counts)
        conj = counts @ self.reach  # [M, J] sessions with at least levels[j] tokens
        g = lb.g
        steps = (g[np.minimum(conj, g.size - 1)] * self.widths[None, :]).sum(axis=1)
        kv = counts @ lb.kv_run / lb.dp
        present = counts > 0
        solo = np.where(present, lb.solo[None, :], 0.0).max(axis=1)
        return np.maximum(steps + kv, solo) * (1 - SLACK)

    def batch_lb(self, lb: LayoutBounds, counts: tuple, b: int) -> float:
        """Lower bound (s) of the makespan of ``counts`` at batch limit ``b`` (capped conjugate)."""
        news = np.repeat(self.new, np.asarray(counts))
        vec = capped_conjugate(news, b)
        g = lb.g
        steps = float(g[np.minimum(vec, g.size - 1)].sum())
        kv = float(np.asarray(counts) @ lb.kv_run) / lb.dp
        solo = max(float(lb.solo[i]) for i, k in enumerate(counts) if k)
        return max(steps + kv, solo) * (1 - SLACK)

    # ------------------------------------------------------------------ enumeration
    def enumerate(self, lay: Layout, deadline: Optional[float] = None) -> Optional[ColumnSet]:
        """Every column of ``lay`` that fits its memory (the average DP rank: the fullest holds at
        least as much) with a makespan bound ≤ ``T_max``, class by class with pruning (both limits
        only grow with more sessions). None past ``MAX_COLUMNS`` or ``deadline``."""
        if lay in self.sets:
            return self.sets[lay]
        lb = self.layouts[lay]
        m = self.perf.model
        static, kv = m.stage_memory_terms(lay, [(int(c), int(n)) for c, n in zip(self.ctx, self.new)])
        mem_limit = self.problem.gpu.memory_bytes * (1 + 1e-12)
        caps = np.minimum(self.counts_max, np.array(lb.option.cap, dtype=np.int64))
        rows = np.zeros((1, self.C), dtype=np.int64)
        mem = np.zeros((1, static.size))
        t_lim = self.t_max_s * (1 + 1e-9)
        for i in range(self.C):
            parts_r, parts_m = [rows], [mem]
            for k in range(1, int(caps[i]) + 1):
                r = rows.copy()
                r[:, i] = k
                mm = mem + k * kv[:, i][None, :]
                ok = np.all(static[None, :] + mm / lb.dp <= mem_limit, axis=1)
                if math.isfinite(t_lim):
                    ok &= self.makespan_lb(lb, r) <= t_lim
                if not ok.any():
                    break
                parts_r.append(r[ok])
                parts_m.append(mm[ok])
            rows = np.concatenate(parts_r)
            mem = np.concatenate(parts_m)
            if rows.shape[0] > MAX_COLUMNS or (deadline is not None and time.perf_counter() > deadline):
                return None
        rows = rows[rows.sum(axis=1) > 0]
        col, load_s, on = self.points(lb, rows)
        loads = np.ceil(load_s / TIME_UNIT_S - 1e-6).astype(np.int64)
        out = ColumnSet(rows, col, loads, on)
        self.sets[lay] = out
        return out

    # ------------------------------------------------------------------ joint bounds
    def points(self, lb: LayoutBounds, rows: np.ndarray):
        """Optimistic (makespan, on-time) points of every column (module docstring): for each
        set U of at-risk sessions claimed on time, the makespan bound given that U meets its
        deadlines (:meth:`two_phase`), with the sessions due at or after ``T_max`` on time.
        Returns (column index, makespan bound s, on-time count) arrays, Pareto per column."""
        base = self.makespan_lb(lb, rows)
        total = rows.sum(axis=1)
        risk = np.nonzero(self.deadline < self.t_max_s)[0]
        m = rows.shape[0]
        if risk.size == 0:
            return np.arange(m), base, total
        risk = risk[np.argsort(self.deadline[risk], kind="stable")]
        safe = total - rows[:, risk].sum(axis=1)
        tuples = _box(self.counts_max[risk])
        if len(tuples) > RISK_TUPLES:  # too many at-risk sets: each session alone by its deadline
            alone = (lb.solo[risk] * (1 - SLACK) <= self.deadline[risk] + 1e-9).astype(np.int64)
            return np.arange(m), base, safe + (rows[:, risk] * alone[None, :]).sum(axis=1)
        cols, loads, ons = [np.arange(m)], [base], [safe]
        for u in tuples:
            if not sum(u) or not self._alone_feasible(lb, risk, u):
                continue
            sel = np.nonzero(np.all(rows[:, risk] >= np.asarray(u)[None, :], axis=1))[0]
            if sel.size == 0:
                continue
            bound = base[sel].copy()
            x = np.zeros(self.C, dtype=np.int64)
            x[risk] = u
            for d in sorted({float(self.deadline[c]) for c, k in zip(risk, u) if k}):
                xd = np.where(self.deadline <= d, x, 0)
                bound = np.maximum(bound, self.two_phase(lb, rows[sel], xd, d))
            ok = np.isfinite(bound)
            cols.append(sel[ok])
            loads.append(bound[ok])
            ons.append(safe[sel[ok]] + int(sum(u)))
        col = np.concatenate(cols)
        load = np.concatenate(loads)
        on = np.concatenate(ons)
        # Pareto per column: sort by (column, load, -on) and keep points that add on-time sessions
        order = np.lexsort((-on, load, col))
        col, load, on = col[order], load[order], on[order]
        keep = np.ones(col.size, dtype=bool)
        best = -1
        prev = -1
        for i in range(col.size):
            if col[i] != prev:
                prev, best = col[i], on[i]
                continue
            if on[i] <= best:
                keep[i] = False
            else:
                best = on[i]
        return col[keep], load[keep], on[keep]

    def _alone_feasible(self, lb: LayoutBounds, risk: np.ndarray, u: tuple) -> bool:
        """At-risk sessions ``u`` (counts of ``risk``'s classes) can all meet their deadlines
        in some run of theirs alone (each alone by its deadline, every deadline prefix by the
        makespan bound): a column-independent necessary condition."""
        x = np.zeros(self.C, dtype=np.int64)
        x[risk] = u
        for c, k in zip(risk, u):
            if k and lb.solo[c] * (1 - SLACK) > self.deadline[c] + 1e-9:
                return False
        for d in sorted({float(self.deadline[c]) for c, k in zip(risk, u) if k}):
            xd = np.where(self.deadline <= d, x, 0)
            if float(self.makespan_lb(lb, xd[None, :])[0]) > d + 1e-9:
                return False
        return True

    def _steps_at(self, lb: LayoutBounds, x: np.ndarray, r: np.ndarray, k2: int) -> np.ndarray:
        """``Σ_k g[c_k]`` of the run of ``x_c`` sessions of ``n_c`` tokens and ``r[:, c]`` of
        ``max(0, n_c − k2)`` (one row per column of ``r``): the conjugate is constant between
        the distinct lengths, so it is ``Σ_j (λ_j − λ_{j−1})·g[count of lengths ≥ λ_j]``."""
        part = np.maximum(0, self.new - int(k2))
        lam = np.unique(np.concatenate((self.new[x > 0], part[part > 0])))
        if lam.size == 0:
            return np.zeros(r.shape[0])
        widths = np.diff(np.concatenate(([0], lam))).astype(np.float64)
        counts = r @ (part[:, None] >= lam[None, :]).astype(np.int64) \
            + (x[:, None] * (self.new[:, None] >= lam[None, :])).sum(axis=0)[None, :]
        return (lb.g[np.minimum(counts, lb.g.size - 1)] * widths[None, :]).sum(axis=1)

    def two_phase(self, lb: LayoutBounds, rows: np.ndarray, x: np.ndarray, d: float) -> np.ndarray:
        """Makespan bound (s) of each column ``rows`` [M, C] whose sessions ``x`` (counts) all
        finish by ``d`` (inf where no run can do it).

        Phase 1 ends when the last session of X finishes (by d); phase 2 has K2 steps. Every other
        session r has at most K2 steps left after phase 1, so at least ``a_r = max(0, n_r − K2)``
        in it; phase 1 then takes at least ``Σ g`` of the run of X and those parts plus their KV
        reads, which must be ≤ d (nonincreasing in K2). The whole run takes at least that
        ``Σ g`` plus K2 steps of one session (``g[1]`` each) plus ``σ`` (the least increment of
        g) per further session-step of phase 2, plus every KV read; moving a session-step into
        phase 1 costs it at least σ there, so the parts at ``a_r`` give the least. This total is
        linear in K2 between breaks (where a part's length meets a length of X or zero), so over
        the feasible K2 (from the least feasible one, inside some segment between breaks) it is
        at least the least value at the breaks from that segment's left end on."""
        m = rows.shape[0]
        r = rows - x[None, :]
        dp = lb.dp
        kv_x = float(x @ lb.kv_run)
        kv_tot = rows @ lb.kv_run
        g1 = float(lb.g[1])
        size = int(rows.sum(axis=1).max())
        top = min(size, lb.g.size - 1)
        sigma = float(lb.g[top] - lb.g[top - 1]) if top >= 1 else 0.0
        xs = {int(self.new[c]) for c in range(self.C) if x[c]}
        n_max = int(self.new.max())
        breaks = {0, n_max}
        for c in range(self.C):
            breaks.add(int(self.new[c]))
            breaks.update(int(self.new[c]) - v for v in xs if self.new[c] > v)
        best = np.full(m, np.inf)
        open_ = np.zeros(m, dtype=bool)  # a feasible K2 exists at or before this break
        prev = None  # (break, steps, total) at the previous break
        for k2 in sorted(breaks):
            steps = self._steps_at(lb, x, r, k2)
            phase1 = steps + (kv_x + r @ self._kv_prefix(lb, k2)) / dp
            total = steps + k2 * g1 + sigma * np.maximum(0, r @ np.minimum(self.new, k2) - k2) + kv_tot / dp
            feasible = phase1 * (1 - SLACK) <= d + 1e-9
            first = np.flatnonzero(feasible & ~open_)
            if prev is not None and first.size:
                # the least feasible K2 lies in (previous break, k2]: bisect it there (Σ g is linear
                # on the segment, the KV read convex), and take the linear total at it
                k0, s0, t0 = prev
                lo = np.full(first.size, k0 + 1, dtype=np.int64)
                hi = np.full(first.size, k2, dtype=np.int64)
                rr = r[first]
                span = max(1, k2 - k0)
                while np.any(lo < hi):
                    mid = (lo + hi) // 2
                    frac = (mid - k0) / span
                    st = s0[first] + frac * (steps[first] - s0[first])
                    a = np.maximum(0, self.new[None, :] - mid[:, None])
                    pre = lb.kv_rate * (a * self.ctx[None, :] + a * (a + 1) / 2.0)
                    ok = (st + (kv_x + (rr * pre).sum(axis=1)) / dp) * (1 - SLACK) <= d + 1e-9
                    hi = np.where(ok, mid, hi)
                    lo = np.where(ok, lo, mid + 1)
                frac = (lo - k0) / span
                at = t0[first] + frac * (total[first] - t0[first])
                best[first] = np.minimum(best[first], at)
            open_ |= feasible
            best = np.where(open_, np.minimum(best, total), best)
            prev = (k2, steps, total)
        return best * (1 - SLACK)

    def _kv_prefix(self, lb: LayoutBounds, k2: int) -> np.ndarray:
        """Per class, the KV read (s) of its first ``max(0, n_c − k2)`` decode steps."""
        a = np.maximum(0, self.new - int(k2))
        return lb.kv_rate * (a * self.ctx + a * (a + 1) / 2.0)

    # ------------------------------------------------------------------ resolution
    def resolve(self, lay: Layout, counts: tuple, deadline: Optional[float] = None) -> Resolved:
        """The Pareto points (makespan, on-time count) of column (``lay``, ``counts``) over every
        batch limit and admission order with a makespan ≤ ``T_max``, by branch and bound over
        admission orders (:class:`_OrderSearch`); ``exact`` False when it stops after
        :data:`RESOLVE_WORK` simulated segments (or at ``deadline``) with the points found."""
        key = (lay, counts)
        if key in self.resolved:
            return self.resolved[key]
        search = _OrderSearch(self, lay, counts, deadline)
        res = Resolved(search.run(), search.exact)
        self.simulated += search.work
        self.resolved[key] = res
        return res


class _OrderSearch:
    """Branch and bound over the admission orders of one column, for each batch limit from the
    largest down (a limit whose capped bound exceeds ``T_max`` ends the loop: smaller ones batch
    less). A node is the instance at a time t with its active sessions (class, tokens done, DP
    rank) and the sessions not yet admitted; while a slot is free it branches on the class
    admitted next, else it simulates to the next finish (the evaluator's semantics, one segment
    of :func:`~optimizer.deployment.batching.simulate`). Sessions admitted at the same event onto
    one attention-DP rank start together on it, so only non-decreasing class sequences are tried
    for each rank's slots of an event (the state is the same whichever holds which). A node
    is cut when ``t`` plus the step-floor bound of the work left (``Σ g`` over the conjugate of
    the remaining lengths, plus their KV reads) exceeds ``T_max``, or when a point found
    already has a makespan at most that bound and at least every session not yet late on time.
    Points are kept Pareto in (makespan, on-time count), the two figures the threshold
    objectives read."""

    def __init__(self, bc: BoundedColumns, lay: Layout, counts: tuple, deadline: Optional[float]):
        self.bc, self.lay, self.counts = bc, lay, tuple(int(k) for k in counts)
        self.lb = bc.layouts[lay]
        self.deadline = deadline
        self.m = bc.perf.model
        self.steps = bc.perf.steps
        self.memo = self.steps.cache("segments")
        self.t_lim = bc.t_max_s * (1 + 1e-9)
        self.found: list[BatchConfiguration] = []
        self.work = 0
        self.exact = True
        self.dp = lay.attention_dp
        self.new = [int(x) for x in bc.new]
        self.ctx = [int(x) for x in bc.ctx]
        self.g = [float(x) for x in self.lb.g]
        self.kv_run = [float(x) for x in self.lb.kv_run]
        self.solo = [float(x) for x in self.lb.solo]
        self.dl = [float(x) for x in bc.deadline]
        # rest[c][d]: the class's remaining decode alone from d tokens done (its fastest finish)
        self.rest = []
        for c in range(len(self.new)):
            steps = self.steps.single_session_step_s(lay, np.arange(self.ctx[c], self.ctx[c] + self.new[c]))
            self.rest.append([float(x) for x in np.cumsum(steps[::-1])[::-1]] + [0.0])
        # branching order: earliest deadline first (good points early make the cuts bite)
        self.by_deadline = sorted(range(len(self.new)), key=lambda c: (self.dl[c], c))
        if self.dp > 1:
            self.static, self.kv = self.m.stage_memory_terms(lay, [(int(c), int(n)) for c, n in zip(bc.ctx, bc.new)])
            self.mem_limit = bc.problem.gpu.memory_bytes * (1 + 1e-12)

    def run(self) -> list:
        bc = self.bc
        n = sum(self.counts)
        cap = min(n, bc.cap)
        for b in range(cap, 0, -1):
            if bc.batch_lb(self.lb, self.counts, b) > self.t_lim or not self.exact:
                break
            self.b = b
            self.order: list[int] = []
            rank_kv = np.zeros((self.static.size, self.dp)) if self.dp > 1 else None
            self._admit(0.0, [], list(self.counts), 0, (0,) * self.dp, 0, 0.0, 0, rank_kv)
        return self.found

    # -------------------------------------------------------------- bounds
    def _floor(self, t: float, active: list, left: list) -> float:
        bc, lb = self.bc, self.lb
        new, ctx = self.new, self.ctx
        lengths = [new[c] - d for c, d, _ in active]
        kv = 0.0
        for c, d, _ in active:
            kv += _positions(ctx[c] + d, new[c] - d)
        kv *= lb.kv_rate
        solo = 0.0
        for c, k in enumerate(left):
            if k:
                lengths.extend([new[c]] * k)
                kv += k * self.kv_run[c]
                solo = max(solo, self.solo[c])
        if not lengths:
            return t
        lengths.sort()
        g, top = self.g, len(self.g) - 1
        steps, prev, m = 0.0, 0, len(lengths)
        for i, x in enumerate(lengths):
            if x > prev:
                steps += (x - prev) * g[min(m - i, top)]
                prev = x
        return (t + max(steps + kv / lb.dp, solo)) * (1 - SLACK)

    def _cut(self, t: float, active: list, left: list, on: int, last: float) -> bool:
        end = max(last, self._floor(t, active, left))
        if end > self.t_lim:
            return True
        # sessions that can still be on time: none finishes before its own remaining time alone
        most = on
        dl, rest = self.dl, self.rest
        for c, d, _ in active:
            if (t + rest[c][d]) * (1 - SLACK) <= dl[c] + 1e-9:
                most += 1
        for c, k in enumerate(left):
            if k and (t + rest[c][0]) * (1 - SLACK) <= dl[c] + 1e-9:
                most += k
        load = ticks_up(end)
        return any(f.load <= load and f.on_time >= most for f in self.found)

    # -------------------------------------------------------------- search
    def _admit(self, t, active, left, pos, low, on, last, fsum, rank_kv) -> None:
        if not self.exact:
            return
        if len(active) < self.b and any(left):
            if self._cut(t, active, left, on, last):
                return
            r = pos % self.dp
            for q in range(low[r], len(left)):
                c = self.by_deadline[q]
                if not left[c]:
                    continue
                if rank_kv is not None:
                    grown = rank_kv[:, r] + self.kv[:, c]
                    if np.any(self.static + grown > self.mem_limit):
                        continue
                    nxt = rank_kv.copy()
                    nxt[:, r] = grown
                else:
                    nxt = None
                left[c] -= 1
                self.order.append(c)
                lows = low[:r] + (q,) + low[r + 1:]  # a rank's slots in one event: classes in order
                self._admit(t, active + [(c, 0, r)], left, pos + 1, lows, on, last, fsum, nxt)
                self.order.pop()
                left[c] += 1
            return
        if not active:
            self._leaf(on, last, fsum)
            return
        self._advance(t, active, left, pos, on, last, fsum, rank_kv)

    def _advance(self, t, active, left, pos, on, last, fsum, rank_kv) -> None:
        bc = self.bc
        if self.work >= RESOLVE_WORK or (self.deadline is not None and time.perf_counter() > self.deadline):
            self.exact = False
            return
        self.work += 1
        k = min(int(bc.new[c]) - d for c, d, _ in active)
        pos_t = tuple(int(bc.ctx[c]) + d for c, d, _ in active)
        ranks = tuple(r for _, _, r in active)
        key = (self.lay, pos_t, ranks, k)
        dts = self.memo.get(key)
        if dts is None:
            if len(active) == 1:
                dts = self.steps.single_session_step_s(self.lay, pos_t[0] + np.arange(k))
            else:
                dts = self.steps.batch_steps_s(self.lay, np.array(pos_t, dtype=np.float64), k, rank=np.array(ranks))
            self.memo[key] = dts
        t2 = float(np.cumsum(np.concatenate(([t], dts)))[-1])  # as the evaluator adds the steps
        still = []
        for c, d, r in active:
            if d + k == int(bc.new[c]):
                on += 1 if t2 <= bc.deadline[c] + 1e-9 else 0
                fsum += ticks_up(t2)
                last = max(last, t2)
            else:
                still.append((c, d + k, r))
        self._admit(t2, still, left, pos, (0,) * self.dp, on, last, fsum, rank_kv)

    def _leaf(self, on: int, last: float, fsum: int) -> None:
        load = ticks_up(last)
        if load > (ticks_up(self.bc.t_max_s) + 1 if math.isfinite(self.bc.t_max_s) else math.inf):
            return
        if any(f.load <= load and f.on_time >= on for f in self.found):
            return
        self.found = [f for f in self.found if not (load <= f.load and on >= f.on_time)]
        self.found.append(BatchConfiguration(self.lay.gpus, self.counts, load, on, self.lay, self.b, fsum,
                                             tuple(self.order)))


def _positions(start: int, steps: int) -> float:
    """Σ_{j<steps} (start + j + 1): the KV positions read by ``steps`` decode steps from ``start``."""
    return steps * start + steps * (steps + 1) / 2


def _box(top: np.ndarray) -> list:
    """Every count tuple ≤ ``top`` (componentwise), smallest sums first."""
    import itertools

    return sorted(itertools.product(*[range(int(t) + 1) for t in top]), key=sum)


def _schedules(counts: tuple, b: int, dp: int) -> int:
    """Distinct schedules of a column at batch limit ``b`` (:func:`_orders`)."""
    n = sum(counts)
    if dp > 1:
        return distinct_orders(counts)
    if b >= n:
        return 1
    # first batch as a multiset, then every order of the rest
    total = 0
    for first in _sub_multisets(counts, b):
        rest = tuple(k - f for k, f in zip(counts, first))
        total += distinct_orders(rest)
    return total


def _sub_multisets(counts: tuple, size: int):
    """Every sub-multiset of ``counts`` with ``size`` elements (as count tuples)."""
    def rec(i: int, left: int, cur: list):
        if i == len(counts):
            if left == 0:
                yield tuple(cur)
            return
        for k in range(min(counts[i], left), -1, -1):
            cur.append(k)
            yield from rec(i + 1, left - k, cur)
            cur.pop()
    yield from rec(0, size, [])


def _orders(counts: tuple, b: int, dp: int, distinct_permutations):
    """Admission orders (class per position) covering every distinct schedule at batch limit
    ``b``: with one DP rank the first ``b`` sessions start together, so their internal order
    does not matter (one order per first-batch multiset, every order of the rest); with DP
    ranks every distinct order (the position sets the rank)."""
    base = [i for i, k in enumerate(counts) for _ in range(k)]
    if dp > 1:
        yield from distinct_permutations(base)
        return
    if b >= len(base):
        yield base
        return
    for first in _sub_multisets(counts, b):
        head = [i for i, k in enumerate(first) for _ in range(k)]
        rest = [i for i, (k, f) in enumerate(zip(counts, first)) for _ in range(k - f)]
        for tail in distinct_permutations(rest):
            yield head + list(tail)


@dataclass(frozen=True)
class Optimistic:
    """An unresolved column's optimistic point (what the masters read)."""

    degree: int
    counts: tuple
    load: int
    on_time: int
    layout: Layout


def merged_problem(problem: Problem, t_max_s: float) -> Problem:
    """``problem`` with the classes that differ only in deadlines at or after ``t_max_s`` merged
    (deadline None): every session of them finishes on time in any replica that ends by
    ``t_max_s``, the only replicas the bounded search keeps, so they are interchangeable there.
    Session ids are kept, so a plan of it is a plan of ``problem`` (re-evaluated on it)."""
    from dataclasses import replace

    from optimizer.deployment.schema import SessionClass

    def key(s):
        safe = s.deadline_s is None or s.deadline_s >= t_max_s
        return (s.context, s.new, None if safe else s.deadline_s)

    keys: dict[tuple, list[str]] = {}
    for s in problem.sessions:
        keys.setdefault(key(s), []).append(s.id)
    if len(keys) == len(problem.classes):
        return problem
    index = {k: i for i, k in enumerate(keys)}
    sessions = tuple(replace(s, deadline_s=key(s)[2], cls=index[key(s)]) for s in problem.sessions)
    classes = tuple(SessionClass(i, k[0], k[1], k[2], tuple(ids)) for i, (k, ids) in enumerate(keys.items()))
    return replace(problem, sessions=sessions, classes=classes)


def _point_for(res: Resolved, load: int, on: int) -> Optional[BatchConfiguration]:
    """The realised point of a resolved column closest to (``load``, ``on``): the most on time
    within ``load``, else the smallest makespan."""
    within = [c for c in res.points if c.load <= load]
    if within:
        return max(within, key=lambda c: (c.on_time, -c.load))
    return min(res.points, key=lambda c: (c.load, -c.on_time), default=None)


class ColumnPool:
    """The master's columns with stable indices: optimistic points, replaced (or joined) by the
    simulated points of a column once it is resolved. An item is live when it is active (not
    replaced) and no other active item with the same sessions beats it on GPUs, makespan and
    on-time count (:func:`dominant`; re-checked when a column's points change)."""

    def __init__(self):
        self.items: list = []
        self.active: list[bool] = []
        self.dominated: list[bool] = []
        self.by_counts: dict[tuple, list[int]] = {}
        self.by_column: dict[tuple, list[int]] = {}
        self.changed: Optional[int] = None  # smallest load (ticks) changed since the last sweep

    def add(self, item) -> None:
        i = len(self.items)
        self.by_column.setdefault((item.layout, tuple(item.counts)), []).append(i)
        self.by_counts.setdefault(tuple(item.counts), []).append(i)
        self.items.append(item)
        self.active.append(True)
        self.dominated.append(False)

    def _touch(self, load: int) -> None:
        self.changed = load if self.changed is None else min(self.changed, load)

    def settle(self, counts: Optional[tuple] = None) -> None:
        """Recompute which items are dominated (all, or those with ``counts``)."""
        groups = [counts] if counts is not None else list(self.by_counts)
        for key in groups:
            idx = [i for i in self.by_counts[key] if self.active[i]]
            keep = {id(c) for c in dominant([self.items[i] for i in idx])}
            for i in self.by_counts[key]:
                dom = not (self.active[i] and id(self.items[i]) in keep)
                if dom != self.dominated[i]:
                    self.dominated[i] = dom
                    self._touch(self.items[i].load)

    def resolve(self, lay: Layout, counts: tuple, res: Resolved) -> None:
        """Swap the column's optimistic points for its simulated ones (kept beside them when the
        resolution is not exhaustive)."""
        for i in self.by_column.get((lay, counts), []):
            if res.exact and self.active[i] and isinstance(self.items[i], Optimistic):
                self.active[i] = False
        for pt in res.points:
            self.add(pt)
            self.dominated[-1] = True  # until settled below
        self.settle(counts)

    def live(self) -> list[int]:
        return [i for i, (a, d) in enumerate(zip(self.active, self.dominated)) if a and not d]


def bounded_search(problem: Problem, perf, kind: str, need: int, deadline: float, layouts,
                   incumbent: Optional[Fraction] = None, t_max_s: Optional[float] = None) -> Optional[BoundedOutcome]:
    """The bounded column search (module docstring) for the threshold objectives.

    Args:
        problem, perf: the problem (no faults) and its PerfModel.
        kind: ``cost`` (key ``G·T/v``) or ``makespan`` (key ``T``), as :class:`ConfigurationSearch`.
        need: on-time sessions required.
        deadline: ``time.perf_counter()`` value to stop at.
        layouts: the layouts allowed.
        incumbent: the best known plan's key (Fraction, the search's unit), or None.
        t_max_s: makespan (s) beyond which no plan better than the incumbent lies, or None.
    Returns:
        BoundedOutcome (its plan's configurations are of the merged problem, :func:`merged_problem`;
        session ids are the problem's), or None when the columns cannot be enumerated in time.
    """
    from optimizer.deployment.params import layout_options

    t0 = time.perf_counter()
    red = merged_problem(problem, math.inf if t_max_s is None else t_max_s)
    options = layout_options(red, perf, layouts)
    bc = BoundedColumns(red, perf, options, t_max_s)
    pool = ColumnPool()
    total = 0
    for lay in list(bc.layouts):
        got = bc.enumerate(lay, deadline)
        if got is None:
            return None
        total += got.counts.shape[0]
        keys = [tuple(int(x) for x in row) for row in got.counts]
        for j, ld, on in zip(got.column, got.load, got.on_time):
            pool.add(Optimistic(lay.gpus, keys[j], int(ld), int(on), lay))
    pool.settle()
    pool.changed = None
    out = BoundedOutcome(None, None, None, False, columns=total)
    out.problem = red
    if any(not any(s.counts[:, c.index].any() for s in bc.sets.values()) for c in red.classes):
        out.infeasible = incumbent is None
        out.bound = incumbent
        out.notes.append("a session class fits no column within the memory and the makespan limit")
        return out
    best_key = incumbent
    dp = CoverDP(red, need) if CoverDP.fits(red) else None
    while time.perf_counter() < deadline:
        out.rounds += 1
        if dp is not None:
            _t = time.perf_counter()
            key, chosen = dp.run(pool, kind, best_key, deadline)
            out.dp_s += time.perf_counter() - _t
            if dp.timed_out:
                break
            round_bound = key
        else:
            configs = [pool.items[i] for i in pool.live()]
            search = ConfigurationSearch(red, configs, need, deadline)
            res = search.run(kind, best_key)
            out.solves += res.lp_solves + res.milp_solves
            key = None if res.counts is None else _key(red, kind, res.counts)
            chosen = res.counts
            round_bound = res.bound
        if chosen is None:  # nothing beats the incumbent among the optimistic columns
            out.bound = best_key if round_bound is None else (round_bound if best_key is None else min(round_bound, best_key))
            out.infeasible = best_key is None and round_bound is None
            break
        out.bound = round_bound if best_key is None else min(round_bound, best_key)
        todo = [c for c, _ in chosen if isinstance(c, Optimistic)]
        if DEBUG:
            print("round", out.rounds, float(key) * 1e-8 if key else None,
                  [(c.layout.label(), c.counts, c.load, c.on_time, type(c).__name__[0],
                    (bc.resolved[(c.layout, c.counts)].exact if (c.layout, c.counts) in bc.resolved else '-')) for c, _ in chosen])
        if not todo:  # a realised plan: every column simulated
            if best_key is None or key < best_key:
                best_key, out.counts, out.value = key, chosen, key
            if out.bound >= best_key:
                break
            continue
        if dp is not None:  # the near-best plans of other on-time targets are resolved now too
            for k2, other in dp.plans[1:NEAR_PLANS]:
                if k2 <= key * (1 + NEAR):
                    todo += [c for c, _ in other if isinstance(c, Optimistic) and c not in todo]
        stuck = True
        for c in todo:
            if (c.layout, c.counts) not in bc.resolved:
                stuck = False
                _t = time.perf_counter()
                pool.resolve(c.layout, c.counts, bc.resolve(c.layout, c.counts, deadline))
                out.resolve_s += time.perf_counter() - _t
                out.resolved += 1
        real = []  # a realised plan from the chosen columns' simulated points
        for c, r in chosen:
            pt = _point_for(bc.resolved[(c.layout, c.counts)], c.load, c.on_time) if isinstance(c, Optimistic) else c
            if pt is None:
                real = None
                break
            real.append((pt, r))
        if real and sum(c.on_time * r for c, r in real) >= need:
            rk = _key(red, kind, real)
            if best_key is None or rk < best_key:
                best_key, out.counts, out.value = rk, real, rk
        if stuck:
            out.notes.append("columns too large to resolve keep their optimistic points")
            break
    if out.counts is not None and out.bound is not None and out.bound >= out.value:
        out.proven = True
    out.simulated = bc.simulated
    out.notes.append(f"{total} optimistic columns, {out.resolved} resolved by simulating {bc.simulated} segments, "
                     f"{out.rounds} master searches, {time.perf_counter() - t0:.2f} s (masters {out.dp_s:.2f} s, "
                     f"orders {out.resolve_s:.2f} s)")
    return out


def _key(problem: Problem, kind: str, counts) -> Fraction:
    mk = max(c.load for c, _ in counts)
    on = sum(c.on_time * r for c, r in counts)
    return Fraction(problem.total_gpus * mk, on) if kind == "cost" else Fraction(mk)


MAX_DP_STATES = 250_000  # sub-multisets of the sessions the exact-cover programme may index
NEAR_PLANS, NEAR = 3, 0.02  # other on-time targets' plans within 2 % of the best are resolved with it
BLOCK = 64  # columns relaxed together in the sweep (a saved table before each block)


class CoverDP:
    """The master of the bounded search on small instances: an exact dynamic programme over the
    sub-multisets of the sessions (``Π (n_c + 1)`` states) instead of the configuration LP/MILP,
    whose integer proofs on a few thousand near-identical columns took HiGHS and CP-SAT 10-20 s.

    ``F[s, l]`` is the fewest GPUs of columns that cover the sub-multiset ``s`` exactly with ``l``
    of its sessions late (``l ≤ N − need``). Columns are added in increasing makespan; each one
    relaxes ``F[s + a, l + late] ≤ F[s, l] + gpus`` for every ``s`` with room for ``a`` (repeated
    for its repeats), the unbounded-knapsack recursion, so after the columns of makespan ≤ T the
    table holds the optimum over every plan of those columns. The first T at which
    ``min_{l ≤ N − v} F[all, l] ≤ G`` is the smallest makespan with v on time (exact for the
    GPU row when layouts pack into servers by count, as for the configuration search); the plan
    is read back from the improving columns at that moment. Tables saved every
    :data:`BLOCK` columns let the next sweep start below the first column that changed
    (resolved points only raise a column's makespan)."""

    def __init__(self, problem: Problem, need: int):
        self.problem = problem
        self.n = np.array([c.count for c in problem.classes], dtype=np.int64)
        self.radix = self.n + 1
        self.stride = np.concatenate(([1], np.cumprod(self.radix)[:-1])).astype(np.int64)
        self.states = int(np.prod(self.radix))
        self.full = int(np.dot(self.n, self.stride))
        self.N = int(self.n.sum())
        self.need = need
        self.L = self.N - need
        self._bases_memo: dict[tuple, np.ndarray] = {}
        self._moves_memo: dict[tuple, tuple] = {}
        self.plans: list = []
        self.snapshots: list = []  # (level, position key, F, ptr, found, best)
        self.timed_out = False

    @staticmethod
    def fits(problem: Problem) -> bool:
        return math.prod(c.count + 1 for c in problem.classes) <= MAX_DP_STATES

    def _bases(self, counts: tuple) -> np.ndarray:
        """States with room for ``counts`` (every ``s`` with ``s + counts ≤ n``), built from the
        cached states of its prefix."""
        got = self._bases_memo.get(counts)
        if got is None:
            k = len(counts) - 1
            head = self._bases(counts[:-1]) if k else np.zeros(1, dtype=np.int64)
            got = np.add.outer(np.arange(int(self.n[k] - counts[-1]) + 1, dtype=np.int64) * self.stride[k], head).ravel()
            self._bases_memo[counts] = got
        return got

    def _moves(self, counts: tuple, late: int) -> tuple:
        """Flat (source, target) cells of the table a column relaxes, and its repeats."""
        key = (counts, late)
        got = self._moves_memo.get(key)
        if got is None:
            a = np.asarray(counts, dtype=np.int64)
            w = self.L + 1
            width = w - late
            src = (self._bases(counts)[:, None] * w + np.arange(width)[None, :]).ravel()
            dst = src + int(np.dot(a, self.stride)) * w + late
            got = self._moves_memo[key] = (src, dst, int(min(self.n[a > 0] // a[a > 0])))
        return got

    def _relax_one(self, F, ptr, col, j) -> None:
        counts = tuple(col.counts)
        late = sum(counts) - int(col.on_time)
        if late > self.L:
            return
        src, dst, reps = self._moves(counts, late)
        G = self.problem.total_gpus
        for _ in range(reps):
            cand = F[src] + col.degree
            better = np.flatnonzero((cand < F[dst]) & (cand <= G))
            if better.size == 0:
                break
            F[dst[better]] = cand[better]
            ptr[dst[better]] = j

    def _relax_block(self, F, ptr, pool: ColumnPool, block: list) -> None:
        """Every column of ``block`` at once: relax from the same table until nothing improves
        (each pass adds one more column use, so this ends within the largest plan's size)."""
        parts = []
        for j in block:
            col = pool.items[j]
            counts = tuple(col.counts)
            late = sum(counts) - int(col.on_time)
            if late <= self.L:
                src, dst, _ = self._moves(counts, late)
                parts.append((src, dst, col.degree, j))
        if not parts:
            return
        src = np.concatenate([p[0] for p in parts])
        dst = np.concatenate([p[1] for p in parts])
        deg = np.concatenate([np.full(p[0].size, p[2], dtype=np.int64) for p in parts])
        js = np.concatenate([np.full(p[0].size, p[3], dtype=np.int64) for p in parts])
        G = self.problem.total_gpus
        sel = np.flatnonzero(F[src] <= G)  # cells whose source is reachable; later passes: just improved
        for _ in range(self.N + 1):
            if sel.size == 0:
                break
            s_, d_ = src[sel], dst[sel]
            cand = F[s_] + deg[sel]
            k = np.flatnonzero((cand < F[d_]) & (cand <= G))
            if k.size == 0:
                break
            np.minimum.at(F, d_[k], cand[k])
            ok = k[cand[k] == F[d_[k]]]
            ptr[d_[ok]] = js[sel[ok]]
            improved = np.zeros(F.size, dtype=bool)
            improved[d_[k]] = True
            sel = np.flatnonzero(improved[src])

    def run(self, pool: ColumnPool, kind: str, cutoff: Optional[Fraction] = None, deadline: Optional[float] = None):
        """Sweep the pool's live columns in increasing load, :data:`BLOCK` at a time (a block
        whose columns let a new on-time target be met is swept again column by column from the
        table before it, so the first load meeting each target is exact). Returns (key,
        [(column, instances)]) of the best plan for ``kind`` (``cost``: ``G·T/v``; ``makespan``:
        ``T`` at ``v = need``), or (None, None) when none beats ``cutoff`` (or none exists);
        ``timed_out`` is set when ``deadline`` passed first. ``plans`` holds every on-time
        target's first plan (key, plan)."""
        G = self.problem.total_gpus
        w = self.L + 1
        cols = sorted(pool.live(), key=lambda j: pool.items[j].load)
        loads = [pool.items[j].load for j in cols]
        changed = pool.changed
        pool.changed = None
        start = None
        if changed is not None:
            while self.snapshots and self.snapshots[-1][0] > changed:
                self.snapshots.pop()
            start = self.snapshots[-1] if self.snapshots else None
        if start is None:
            F = np.full(self.states * w, np.iinfo(np.int64).max // 4, dtype=np.int64)
            ptr = np.full(self.states * w, -1, dtype=np.int64)
            F[0] = 0
            plans: dict[int, tuple] = {}
            i = 0
            self.snapshots = [(-1, F.copy(), ptr.copy(), {})]
        else:
            level0, F, ptr, plans = start
            F, ptr, plans = F.copy(), ptr.copy(), dict(plans)
            i = int(np.searchsorted(loads, level0, side="left")) if level0 >= 0 else 0
        best = min(plans.values(), key=lambda kp: kp[0], default=(None, None))
        self.timed_out = False
        full = self.full * w

        def stop(level) -> bool:
            floor = Fraction(G * level, self.N) if kind == "cost" else Fraction(level)
            return (cutoff is not None and floor >= cutoff) or (best[0] is not None and floor >= best[0])

        def met(level) -> bool:
            nonlocal best
            row = F[full:full + w]
            hit = False
            for v in range(self.need, self.N + 1):
                if v in plans:
                    continue
                ok = np.nonzero(row[:self.N - v + 1] <= G)[0]
                if ok.size:
                    key = Fraction(G * level, v) if kind == "cost" else Fraction(level)
                    if cutoff is not None and key >= cutoff:
                        continue  # no better than the incumbent: not a plan of interest
                    l0 = int(ok[np.argmin(row[ok])])
                    plans[v] = (key, self._plan(pool, ptr, l0))
                    if best[0] is None or key < best[0]:
                        best = plans[v]
                    hit = True
            return hit

        def unmet() -> bool:
            row = F[full:full + w]
            return any(v not in plans and bool(np.any(row[:self.N - v + 1] <= G)) for v in range(self.need, self.N + 1))

        while i < len(cols):
            if stop(loads[i]):
                break  # every plan from here on is at least this
            if deadline is not None and time.perf_counter() > deadline:
                self.timed_out = True
                break
            self.snapshots.append((loads[i], F.copy(), ptr.copy(), dict(plans)))  # the table before this block
            end = min(len(cols), i + BLOCK)
            while end < len(cols) and loads[end] == loads[end - 1]:
                end += 1  # a level is never split
            self._relax_block(F, ptr, pool, cols[i:end])
            if not unmet():
                i = end
                continue
            # a new target is met inside the block: again column by column from the table before it
            _, F0, P0, _ = self.snapshots[-1]
            F[:] = F0
            ptr[:] = P0
            halted = False
            while i < end:
                level = loads[i]
                if stop(level) or (kind != "cost" and plans):
                    halted = True
                    break
                while i < end and loads[i] == level:
                    self._relax_one(F, ptr, pool.items[cols[i]], cols[i])
                    i += 1
                met(level)
            if halted or (kind != "cost" and plans):
                break
        self.plans = sorted(plans.values(), key=lambda kp: kp[0])
        return best

    def _plan(self, pool: ColumnPool, ptr, l0: int) -> list:
        s, l = self.full, l0
        w = self.L + 1
        used: dict[int, int] = {}
        while s:
            j = int(ptr[s * w + l])
            if j < 0:
                raise RuntimeError("cover DP: broken pointer chain")
            col = pool.items[j]
            a = np.asarray(col.counts, dtype=np.int64)
            used[j] = used.get(j, 0) + 1
            s -= int(np.dot(a, self.stride))
            l -= int(a.sum()) - int(col.on_time)
        return [(pool.items[j], r) for j, r in used.items()]


def dominant(columns: list) -> list:
    """The columns no other column of the same sessions beats on GPUs, makespan and on-time
    count (every threshold objective and the GPU row prefer fewer, smaller, more)."""
    by: dict[tuple, list] = {}
    for c in columns:
        by.setdefault((tuple(c.counts)), []).append(c)
    out = []
    for group in by.values():
        group.sort(key=lambda c: (c.load, c.degree, -c.on_time))
        keep: list = []
        for c in group:
            if not any(o.degree <= c.degree and o.load <= c.load and o.on_time >= c.on_time for o in keep):
                keep.append(c)
        out.extend(keep)
    return out
