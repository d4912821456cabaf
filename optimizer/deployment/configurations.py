"""Configuration formulation of the deployment problem (no faults; cost, makespan, energy).

Instances of one TP degree are interchangeable, and in the long-context regime an instance
holds few sessions, so the compact formulation (``x[k][c]`` per instance) has a weak LP
bound and much symmetry. Here the decision is instead *how many instances run each
configuration*: a configuration is a TP degree p and a vector ``a`` of session counts per
class that fits one instance:

* memory (eq. 6-1): ``Σ_c kv_bytes[p][c] · a_c ≤ room_bytes[p]``;
* load: ``L(a) = Σ_c t[p][c] · a_c ≤ UB`` (an upper bound on the optimal makespan);
* on-time sessions ``on(a)``: the most that can meet their deadlines when run one after
  another, by Moore-Hodgson's algorithm (optimal for 1||ΣU_j; Moore 1968), the rest run
  after them.

For a makespan threshold T and an on-time target v, a plan exists iff the integer program
  ``z[p,a] ≥ 0`` integer, for configurations with ``L(a) ≤ T``:
  ``assignment[class c]: Σ z[p,a] · a_c = n_c``;
  ``gpus: Σ p · z[p,a] ≤ G · servers`` (exact when every degree ≤ G divides G and every
  larger degree is a multiple of G: then instances pack into servers first-fit);
  ``on_time: Σ z[p,a] · on(a) ≥ v``
has a solution. Its LP relaxation (Gilmore and Gomory 1961) is very tight; the smallest
load level at which the LP is feasible is a lower bound on the makespan. The search
(:class:`ConfigurationSearch`) raises T over the load levels in increasing order of the
bound ``G·T/v`` (cost) or T (makespan), and stops as soon as an integer plan meets the
lowest remaining bound: that plan is optimal. LPs and MILPs are solved by HiGHS (highspy).
Memory and deadline limits are enforced by construction (configurations that break them
are never generated), so infeasibility explanations use the compact CP-SAT formulation.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

import bisect
import heapq
import time

import highspy
import numpy as np

from optimizer.deployment.params import Option
from optimizer.deployment.schema import Problem
from optimizer.highs import new_highs, single_thread

MAX_CONFIGURATIONS = 300_000  # beyond this the compact formulation is used instead
RESTRICTED_COLUMNS = 400  # columns of smallest reduced cost in the quick restricted MILP
RESTRICTED_TIME_S = 1.0


@dataclass(frozen=True)
class Configuration:
    degree: int
    counts: tuple[int, ...]  # sessions per class
    load: int  # ticks
    on_time: int  # sessions on time (Moore-Hodgson)


def moore_hodgson_order(jobs: list[tuple[int, Optional[int]]]) -> tuple[list[int], list[int]]:
    """Split jobs (processing ticks, deadline ticks or None) into an on-time set, in EDD
    order, and the late rest, maximising the on-time count on one machine
    (Moore-Hodgson: take jobs in EDD order, drop the longest so far when one is late).
    Jobs without a deadline count as on time and run after the due ones.

    Returns:
        (on-time job indices in run order, late job indices).
    """
    due = sorted((d, t, i) for i, (t, d) in enumerate(jobs) if d is not None)
    free = [i for i, (_, d) in enumerate(jobs) if d is None]
    heap: list[tuple[int, int]] = []
    total = 0
    late: list[int] = []
    for d, t, i in due:
        heapq.heappush(heap, (-t, i))
        total += t
        if total > d:
            negt, j = heapq.heappop(heap)  # drop the longest so far
            total += negt
            late.append(j)
    kept = {i for _, i in heap}
    on_time = [i for _, _, i in due if i in kept] + free
    return on_time, late


def moore_hodgson(jobs: list[tuple[int, Optional[int]]]) -> int:
    """Most jobs that can finish by their deadlines on one machine (see moore_hodgson_order)."""
    return len(moore_hodgson_order(jobs)[0])


def enumerate_configurations(problem: Problem, options: dict[int, Option], deadline_ticks: list,
                             ub_ticks: int, limit: int = MAX_CONFIGURATIONS,
                             deadline: Optional[float] = None) -> Optional[list[Configuration]]:
    """All configurations with load ≤ ``ub_ticks``; None if there are more than ``limit``, or
    when the wall clock passes ``deadline`` (``time.perf_counter()`` seconds) first."""
    classes = problem.classes
    out: list[Configuration] = []
    calls = [0]
    for p, opt in options.items():
        caps = [min(c.count, opt.cap[c.index]) for c in classes]
        if max(caps, default=0) == 0:
            continue
        counts = [0] * len(classes)
        # classes in earliest-deadline order (no deadline last): Moore-Hodgson then runs along
        # the recursion, k jobs of a class at a time, instead of once per configuration
        order = sorted(range(len(classes)), key=lambda i: (deadline_ticks[i] is None, deadline_ticks[i] or 0,
                                                           opt.ticks[i]))

        def rec(pos: int, load: int, mem: int, kept: list, total: int, free: int) -> bool:
            calls[0] += 1
            if deadline is not None and calls[0] % 256 == 0 and time.perf_counter() > deadline:
                return False
            if pos == len(order):
                if load > 0:
                    out.append(Configuration(p, tuple(counts), load, len(kept) + free))
                    if len(out) > limit:
                        return False
                return True
            i = order[pos]
            t, kv, d = opt.ticks[i], opt.kv_bytes[i], deadline_ticks[i]
            kept = list(kept)
            k = 0
            while k <= caps[i] and load + k * t <= ub_ticks and mem + k * kv <= opt.room_bytes:
                counts[i] = k
                if not rec(pos + 1, load + k * t, mem + k * kv, kept, total, free + (k if d is None else 0)):
                    return False
                if d is not None:  # one more job of this class: Moore-Hodgson's step
                    bisect.insort(kept, t)
                    total += t
                    if total > d:
                        total -= kept.pop()  # drop the longest so far
                k += 1
            counts[i] = 0
            return True

        first = len(out)
        if not rec(0, 0, 0, [], 0, 0):
            return None
        # columns in lexicographic order of their counts, as class-index recursion lists them: the
        # MILP's branching depends on the column order, and this order is the benchmarked one
        out[first:] = sorted(out[first:], key=lambda c: c.counts)
    return out


def chain_degrees(problem: Problem, degrees) -> bool:
    """True when aggregate GPU counting is exact: every degree ≤ G divides G and every larger
    degree is a multiple of G (then identical servers pack the instances first-fit)."""
    g = problem.server.gpus
    return all((g % p == 0) if p <= g else (p % g == 0) for p in degrees)


@dataclass
class SearchOutcome:
    """Result of :meth:`ConfigurationSearch.run`.

    Attributes:
        counts: instances per configuration of the best plan found (None if none).
        makespan_ticks: its makespan (ticks).
        on_time: its on-time count (Moore-Hodgson per instance).
        bound: proven lower bound on the objective over plans better than the incumbent
            given to the search (cost: Fraction of ticks·GPUs per session; makespan: ticks).
        proven: the plan is optimal.
        lp_solves, milp_solves: solver calls made.
    """

    counts: Optional[list[tuple[Configuration, int]]]
    makespan_ticks: Optional[int]
    on_time: Optional[int]
    bound: Optional[Fraction]
    proven: bool
    lp_solves: int = 0
    milp_solves: int = 0


class ConfigurationSearch:
    """Threshold search over configuration LPs/MILPs (see module docstring).

    Args:
        problem: the problem (no faults).
        configs: every configuration with load ≤ the enumeration bound.
        required: on-time sessions required (≥ 1 for the cost objective).
        deadline_s: wall-clock time at which to stop (time.perf_counter() value).
        gpu_limit: GPUs the instances may use (default: all GPUs of all servers).
    """

    def __init__(self, problem: Problem, configs: list[Configuration], required: int, deadline_s: float,
                 gpu_limit: Optional[int] = None):
        self.problem = problem
        self.gpu_limit = problem.total_gpus if gpu_limit is None else gpu_limit
        self.extra = None  # optional (coefficients per column in self.configs order, upper bound)
        self.configs = sorted(configs, key=lambda c: c.load)
        self.loads = np.array([c.load for c in self.configs], dtype=np.int64)
        self.levels = np.unique(self.loads)
        self.required = required
        self.deadline = deadline_s
        cls = problem.classes
        self.A = np.vstack([np.array([c.counts[k.index] for c in self.configs], dtype=float) for k in cls]
                           + [np.array([c.degree for c in self.configs], dtype=float),
                              np.array([c.on_time for c in self.configs], dtype=float)])
        self.ub = np.array([min([k.count // a for k, a in zip(cls, c.counts) if a]) for c in self.configs], dtype=float)
        self.lp_solves = 0
        self.milp_solves = 0

    # ------------------------------------------------------------------ HiGHS calls
    def _model(self, cols, need: int, integer: bool):
        """A HiGHS model over configuration columns ``cols``; objective: most on time."""
        idx = np.asarray(cols)
        a = self.A[:, idx]
        h = new_highs()
        single_thread(h)
        lp = highspy.HighsLp()
        lp.num_col_ = len(idx)
        lp.col_cost_ = -a[-1]
        lp.col_lower_ = np.zeros(len(idx))
        lp.col_upper_ = self.ub[idx]
        lp.num_row_ = a.shape[0]
        counts = [k.count for k in self.problem.classes]
        lower, upper = counts + [0.0, float(need)], counts + [float(self.gpu_limit), highspy.kHighsInf]
        if self.extra is not None:  # one more row: Σ coefficient·z ≤ upper
            a = np.vstack([a, np.asarray(self.extra[0], dtype=float)[idx]])
            lower, upper = lower + [-highspy.kHighsInf], upper + [float(self.extra[1])]
        lp.num_row_ = a.shape[0]
        lp.row_lower_ = np.array(lower)
        lp.row_upper_ = np.array(upper)
        rows, cs = np.nonzero(a.T)[1], np.nonzero(a.T)[0]  # column-major order of non-zeros
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.searchsorted(cs, np.arange(len(idx) + 1)).astype(np.int32)
        lp.a_matrix_.index_ = rows.astype(np.int32)
        lp.a_matrix_.value_ = a[rows, cs]
        if integer:
            lp.integrality_ = [highspy.HighsVarType.kInteger] * len(idx)
        h.passModel(lp)
        return h, idx

    def _lp(self, level: int, need: int):
        """LP at threshold ``level``: one persistent model, columns above the threshold
        closed by their bounds, so HiGHS re-solves warm from the last basis. Each solve gets
        the time left to the deadline ("unknown" when it ends there, never read as infeasible)."""
        left = self.deadline - time.perf_counter()
        if left <= 0:
            return "unknown", None, None, None
        if getattr(self, "_h", None) is None:
            self._h, _ = self._model(np.arange(len(self.configs)), need, False)
            self._open = len(self.configs)
            self._need = need
        h = self._h
        if need != self._need:
            h.changeRowBounds(len(self.problem.classes) + 1, float(need), highspy.kHighsInf)
            self._need = need
        k = int(np.searchsorted(self.loads, self.levels[level], side="right"))
        if k != self._open:
            ub = np.where(np.arange(len(self.configs)) < k, self.ub, 0.0)
            h.changeColsBounds(len(self.configs), np.arange(len(self.configs), dtype=np.int32),
                               np.zeros(len(self.configs)), ub)
            self._open = k
        self.lp_solves += 1
        h.setOptionValue("time_limit", max(0.01, self.deadline - time.perf_counter()))
        h.run()
        if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
            sol = h.getSolution()
            return "feasible", np.array(sol.col_value)[:k], np.arange(k), np.array(sol.col_dual)[:k]
        if h.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
            return "infeasible", None, None, None
        return "unknown", None, None, None

    def _milp(self, cols, need: int, time_limit: float):
        h, idx = self._model(cols, need, True)
        h.setOptionValue("time_limit", max(0.01, time_limit))
        self.milp_solves += 1
        h.run()
        st = h.getModelStatus()
        if st == highspy.HighsModelStatus.kOptimal or h.getInfo().primal_solution_status == 2:
            return "feasible", np.array(h.getSolution().col_value), idx
        if st == highspy.HighsModelStatus.kInfeasible:
            return "infeasible", None, idx
        return "unknown", None, idx

    def lp_level(self, need: int, lo: int = 0) -> Optional[int]:
        """Smallest load level ≥ ``lo`` at which the LP is feasible (None: not even at the top).

        Raises:
            TimeoutError: the deadline passed, or HiGHS returned no status (unresolved, never
                taken as infeasible).
        """
        hi = len(self.levels) - 1
        if lo > hi:
            return None
        top = self._lp(hi, need)[0]
        if top == "unknown":  # HiGHS gave no answer (an error, not a proof): never read as infeasible
            raise TimeoutError
        if top != "feasible":
            return None
        while lo < hi:
            if time.perf_counter() >= self.deadline:
                raise TimeoutError
            mid = (lo + hi) // 2
            st = self._lp(mid, need)[0]
            if st == "unknown":
                raise TimeoutError
            if st == "feasible":
                hi = mid
            else:
                lo = mid + 1
        return lo

    def integer_at(self, level: int, need: int):
        """An integer plan at threshold ``level`` with ≥ ``need`` on time.

        The LP optimum is often integral already; otherwise a MILP over the LP's support
        and the columns of smallest reduced cost is tried briefly, then the full MILP.
        Returns ("feasible", counts) | ("infeasible", None) | ("unknown", None)."""
        st, x, idx, dual = self._lp(level, need)
        if st != "feasible":
            return st, None
        if np.allclose(x, np.round(x), atol=1e-7):
            return "feasible", self._counts(x, idx)
        left = self.deadline - time.perf_counter()
        if left <= 0.05:
            return "unknown", None
        support = np.nonzero(x > 1e-9)[0]
        near = np.argsort(np.abs(dual))[:RESTRICTED_COLUMNS]
        cols = np.union1d(support, near)
        st, xr, ridx = self._milp(idx[cols], need, min(left, RESTRICTED_TIME_S))
        if st == "feasible":
            return "feasible", self._counts(xr, ridx)
        left = self.deadline - time.perf_counter()
        if left <= 0.05:
            return "unknown", None
        st, xf, fidx = self._milp(idx, need, left)
        if st != "feasible":
            return st, None
        return "feasible", self._counts(xf, fidx)

    def _counts(self, x, idx) -> list[tuple[Configuration, int]]:
        out = []
        for j, v in zip(idx, x):
            r = int(round(v))
            if r > 0:
                out.append((self.configs[j], r))
        return out

    # ------------------------------------------------------------------ search
    def run(self, kind: str, incumbent: Optional[Fraction]) -> SearchOutcome:
        """Best-first search over (on-time target v, load level).

        ``kind`` ``cost``: key ``G·T/v``; ``makespan``: key ``T`` with v = required (the search
        kinds of :class:`objectives.deployment.base.DeploymentObjective`).
        ``incumbent`` (same unit as the key) prunes targets that cannot beat it.
        """
        n = len(self.problem.sessions)
        g = self.problem.total_gpus
        targets = range(self.required, n + 1) if kind == "cost" else [self.required]
        heap: list[tuple[Fraction, int, int]] = []
        stuck: list[Fraction] = []  # bounds of targets the time limit left unresolved
        lo = 0
        try:
            for v in targets:
                lvl = self.lp_level(v, lo)
                if lvl is None:
                    break  # more on time needs configurations beyond the enumeration bound
                lo = lvl
                heapq.heappush(heap, (self._key(kind, lvl, v), v, lvl))
        except TimeoutError:
            # targets not reached need at least the last level found, with at most n on time
            stuck.append(Fraction(g * int(self.levels[lo]), n) if kind == "cost" else Fraction(int(self.levels[lo])))
        best: Optional[tuple[Fraction, list, int, int]] = None
        while heap:
            key, v, lvl = heap[0]
            if best is not None and best[0] <= key:
                break
            if incumbent is not None and key >= incumbent:
                break  # nothing left can beat the incumbent (kept in the bound)
            if time.perf_counter() >= self.deadline:
                break
            heapq.heappop(heap)
            st, counts = self.integer_at(lvl, v)
            if st == "feasible":
                mk = max(c.load for c, _ in counts)
                on = sum(c.on_time * r for c, r in counts)
                val = Fraction(g * mk, on) if kind == "cost" else Fraction(mk)
                if best is None or val < best[0]:
                    best = (val, counts, mk, on)
            elif st == "infeasible":
                if lvl + 1 < len(self.levels):
                    try:
                        nxt = self.lp_level(v, lvl + 1)
                    except TimeoutError:
                        stuck.append(self._key(kind, lvl + 1, v))
                        continue
                    if nxt is not None:
                        heapq.heappush(heap, (self._key(kind, nxt, v), v, nxt))
            else:
                stuck.append(key)
        pending = [k for k, _, _ in heap] + stuck
        if best is None:
            bound = min(pending) if pending else None
            return SearchOutcome(None, None, None, bound, False, self.lp_solves, self.milp_solves)
        bound = min([best[0]] + pending)
        return SearchOutcome(best[1], best[2], best[3], bound, bound >= best[0], self.lp_solves, self.milp_solves)

    def _key(self, kind: str, level: int, v: int) -> Fraction:
        t = int(self.levels[level])
        return Fraction(self.problem.total_gpus * t, v) if kind == "cost" else Fraction(t)
