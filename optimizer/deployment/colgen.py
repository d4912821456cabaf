"""Configuration LP by column generation: a bound on the on-time sessions at a makespan threshold
when instances decode one session at a time, tighter than the fluid LP of
:class:`~optimizer.deployment.anytime.BoundLP`.

A *configuration* is one instance: a kind k (layout, g_k GPUs) and how many sessions x_c of each
class it runs, y_c of them on time. It is feasible at makespan T when ``Σ_c alone_kc·x_c ≤ T``
(one session at a time, no idle time), its sessions' KV fits every GPU
(``Σ_c kv_kc·x_c ≤ room_k`` per pipeline stage, all of them resident for the run) and its on-time
sessions meet their deadlines in deadline order (Jackson: for every deadline d,
``Σ_{d_c ≤ d} alone_kc·y_c ≤ d``); late sessions run after them, so Moore-Hodgson reaches that
on-time count. The master LP chooses λ_j ≥ 0 instances of each configuration j:

    max Σ_j on_j·λ_j   s.t.  Σ_j x_jc·λ_j = count_c (every class),  Σ_j g_j·λ_j ≤ G.

Columns come from pricing: per kind, the integer program above with objective
``Σ y_c − Σ π_c·x_c`` (π: the duals of the class rows) solved by HiGHS. Whatever the columns
found so far, the restricted master's duals (π, σ) with σ raised by ``max_j δ_j/g_j`` (δ_j: the
best reduced profit of a kind, from the pricing MIP's dual bound) are dual feasible for the full
master, so ``Σ π_c·count_c + σ'·G`` bounds the on-time count of every plan with makespan ≤ T
(Farley's bound, Lübbecke and Desrosiers 2005, "Selected topics in column generation"). The
bound is valid after any number of iterations and reaches the master's optimum when pricing
finds nothing better.
"""
from __future__ import annotations

import math
import time
from typing import Optional

import numpy as np

CG_MAX_CLASSES = 64  # the configuration LP is built up to this many classes
SLACK_PENALTY = 2.0  # objective of an uncovered session in the restricted master (> any on-time gain)
PRICE_GAP = 1e-6  # relative MIP gap of the pricing problems


class ConfigLP:
    """Column generation over the configurations of one problem (all kinds one at a time).

    Args:
        counts: sessions per class [C]; dl: deadline per class (s, inf: none) [C].
        kinds: per kind (gpus, alone [C] s, kv [S, C] bytes per GPU, room [S] bytes per GPU).
        gpus: GPUs available.
    """

    def __init__(self, counts: np.ndarray, dl: np.ndarray, kinds: list, gpus: int):
        self.counts = np.asarray(counts, dtype=float)
        self.dl = np.asarray(dl, dtype=float)
        self.kinds = kinds
        self.G = float(gpus)
        self.pool: list[tuple[int, np.ndarray, float, float, np.ndarray]] = []  # (kind, x, on time, load s, y)
        self._keys: set = set()
        self.solves = 0

    @classmethod
    def for_problem(cls, problem, kinds) -> Optional["ConfigLP"]:
        """The configuration LP of ``problem`` with the :class:`~optimizer.deployment.anytime.Kind`
        list ``kinds``, or None (a kind decodes in batches, or more than CG_MAX_CLASSES classes)."""
        classes = problem.classes
        if not kinds or len(classes) > CG_MAX_CLASSES or any(k.batch_cap != 1 for k in kinds):
            return None
        counts = np.array([c.count for c in classes], dtype=float)
        dl = np.array([c.deadline_s if c.deadline_s is not None else np.inf for c in classes])
        ks = [(k.gpus, np.where(k.fits, k.alone, np.inf), k.kv, problem.gpu.memory_bytes - k.static) for k in kinds]
        return cls(counts, dl, ks, problem.total_gpus)

    def add(self, k: int, x: np.ndarray, y: np.ndarray) -> None:
        """Put a configuration (kind, sessions per class, of them on time) in the pool."""
        x = np.round(x).astype(np.int64)
        y = np.minimum(np.round(y).astype(np.int64), x)
        key = (k, tuple(x), tuple(y))
        if key in self._keys or not x.any():
            return
        self._keys.add(key)
        self.pool.append((k, x, float(y.sum()), self._load(k, x), y))

    def _load(self, k: int, x: np.ndarray) -> float:
        """Makespan (s) of configuration x on kind k: its sessions one after another."""
        return float(np.sum(np.where(x > 0, self.kinds[k][1], 0.0) * x))

    def add_plan(self, columns) -> None:
        """Put a plan's instances, (kind, sessions per class, of them on time) each, in the pool."""
        for k, x, y in columns:
            self.add(k, np.asarray(x), np.asarray(y))

    # -------------------------------------------------------------- pricing
    def _price(self, k: int, T: float, pi: np.ndarray):
        """Best configuration of kind k for duals ``pi``: (x, y, value, dual bound of the value)
        or None (nothing fits); value = Σ y − Σ π·x."""
        import highspy

        from optimizer.highs import new_highs, single_thread

        g, alone, kv, room = self.kinds[k]
        C = len(self.counts)
        ok = np.isfinite(alone) & (alone <= T * (1 + 1e-12))
        if not ok.any():
            return None
        cols = [c for c in range(C) if ok[c]]
        n = len(cols)
        ycan = [c for c in cols if alone[c] <= self.dl[c] * (1 + 1e-9)]
        # variables: x_c (c in cols), then y_c (c in ycan)
        nv = n + len(ycan)
        cost = np.concatenate([-pi[cols], np.ones(len(ycan))])
        ub = np.concatenate([np.minimum(self.counts[cols], np.floor(T * (1 + 1e-12) / alone[cols])),
                             [self.counts[c] for c in ycan]])
        rows = []  # (coefficients over variables, upper)
        rows.append((np.concatenate([alone[cols], np.zeros(len(ycan))]), T * (1 + 1e-12)))
        for s in range(kv.shape[0]):
            rows.append((np.concatenate([kv[s, cols], np.zeros(len(ycan))]), float(room[s])))
        xi = {c: i for i, c in enumerate(cols)}
        for j, c in enumerate(ycan):  # y_c ≤ x_c
            a = np.zeros(nv)
            a[n + j], a[xi[c]] = 1.0, -1.0
            rows.append((a, 0.0))
        for dv in np.unique(self.dl[ycan]) if ycan else ():
            if not math.isfinite(dv):
                continue
            a = np.zeros(nv)
            for j, c in enumerate(ycan):
                if self.dl[c] <= dv:
                    a[n + j] = alone[c]
            rows.append((a, dv * (1 + 1e-9)))
        A = np.array([r[0] for r in rows])
        h = new_highs()
        single_thread(h)
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = nv, len(rows)
        lp.col_cost_ = cost
        lp.col_lower_ = np.zeros(nv)
        lp.col_upper_ = ub
        lp.row_lower_ = np.full(len(rows), -np.inf)
        lp.row_upper_ = np.array([r[1] for r in rows])
        lp.sense_ = highspy.ObjSense.kMaximize
        lp.integrality_ = [highspy.HighsVarType.kInteger] * nv
        nz = np.nonzero(A)
        order = np.lexsort((nz[0], nz[1]))
        ri, ci = nz[0][order], nz[1][order]
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.searchsorted(ci, np.arange(nv + 1)).astype(np.int32)
        lp.a_matrix_.index_ = ri.astype(np.int32)
        lp.a_matrix_.value_ = A[ri, ci]
        h.passModel(lp)
        h.setOptionValue("mip_rel_gap", PRICE_GAP)
        h.setOptionValue("mip_abs_gap", 1e-9)
        h.run()
        self.solves += 1
        st = h.getModelStatus()
        info = h.getInfo()
        if st == highspy.HighsModelStatus.kInfeasible:
            return None
        dual = float(info.mip_dual_bound)
        if not math.isfinite(dual):
            dual = float(np.sum(np.maximum(cost, 0) * ub))  # the trivial bound
        sol = np.array(h.getSolution().col_value) if info.primal_solution_status else None
        if sol is None:
            return None, None, -math.inf, dual
        x = np.zeros(C)
        y = np.zeros(C)
        x[cols] = np.round(sol[:n])
        for j, c in enumerate(ycan):
            y[c] = round(sol[n + j])
        return x, y, float(np.sum(y) - pi @ x), dual

    # -------------------------------------------------------------- master
    def upper(self, T: float, deadline: float) -> Optional[float]:
        """Upper bound on the on-time sessions of any plan with makespan ≤ T (s); −1 when the
        master (with every column priced) proves no plan fits; None when no bound was reached
        before ``deadline`` (a ``time.perf_counter()`` value)."""
        import highspy

        from optimizer.highs import new_highs, single_thread

        C = len(self.counts)
        h = new_highs()
        single_thread(h)
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        inf = highspy.kHighsInf
        for c in range(C):  # slack columns: uncovered sessions cost SLACK_PENALTY each
            h.addCol(-SLACK_PENALTY, 0.0, inf, 0, np.array([], dtype=np.int32), np.array([]))
        h.addRows(C + 1, np.concatenate([self.counts, [-inf]]), np.concatenate([self.counts, [self.G]]),
                  C, np.arange(C + 1, dtype=np.int32), np.arange(C, dtype=np.int32), np.ones(C))
        if h.getNumRow() != C + 1:
            raise RuntimeError("configuration LP: rows not added")
        used = 0

        def push(col):
            k, x, on, load, _ = col
            idx = np.nonzero(x)[0]
            h.addCol(on, 0.0, inf, len(idx) + 1, np.concatenate([idx, [C]]).astype(np.int32),
                     np.concatenate([x[idx].astype(float), [float(self.kinds[k][0])]]))

        best = None
        while True:
            for col in self.pool[used:]:
                if col[3] <= T * (1 + 1e-12):
                    push(col)
            used = len(self.pool)
            h.run()
            self.solves += 1
            if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
                return best
            sol = h.getSolution()
            duals = np.array(sol.row_dual)
            value = float(h.getInfo().objective_function_value)
            # HiGHS's sign convention for a maximisation: take the one whose dual objective
            # equals the primal value (strong duality)
            if abs(float(-duals[:C] @ self.counts) - duals[C] * -self.G - value) < \
                    abs(float(duals[:C] @ self.counts) + duals[C] * self.G - value):
                duals = -duals
            pi, sigma = duals[:C], max(0.0, float(duals[C]))
            slack = float(np.sum(np.array(sol.col_value)[:C]))
            rise, added, priced = 0.0, False, 0
            for k in range(len(self.kinds)):
                if time.perf_counter() >= deadline:
                    break
                priced += 1
                got = self._price(k, T, pi)
                if got is None:
                    continue
                x, y, val, dual = got
                g = self.kinds[k][0]
                rise = max(rise, (dual - sigma * g) / g)
                if x is not None and val - sigma * g > 1e-7:
                    self.add(k, x, y)
                    added = True
            if priced == len(self.kinds):  # every kind priced: a valid bound
                ub = float(pi @ self.counts) + (sigma + max(0.0, rise)) * self.G
                best = ub if best is None else min(best, ub)
                if not added and rise <= 1e-9 and slack > 1e-6:
                    return -1.0  # every column priced and sessions remain uncovered: infeasible
            if not added or time.perf_counter() >= deadline:
                return best

    def integer_plan(self, T: float, deadline: float) -> Optional[list[tuple[int, np.ndarray]]]:
        """Instances (kind, sessions per class) of load ≤ T from the pool (a price-and-branch
        heuristic, no optimality claim): the restricted master's LP solution rounded down, the
        sessions left over covered by an integer master on the GPUs left (the pool's
        configurations cut down to them, and single sessions); if that fails, one integer master
        over the pool for all sessions. None when neither finds a plan before ``deadline``."""
        cols = [c for c in self.pool if c[3] <= T * (1 + 1e-12)]
        if not cols:
            return None
        counts = self.counts.astype(np.int64)
        base = [(k, x.copy(), y.copy()) for lam, k, x, y in self.lp_solution(T) for _ in range(int(math.floor(lam + 1e-9)))]
        rest = counts - (np.sum([x for _, x, _ in base], axis=0) if base else 0)
        gpus = self.G - sum(self.kinds[k][0] for k, _, _ in base)
        if base and np.all(rest >= 0) and gpus >= 0:
            if not rest.any():
                return [(k, x) for k, x, _ in base]
            cut = {}  # (kind, x) -> y with the most on time
            for k, x, on, load, y in cols:
                xr = np.minimum(x, rest)
                yr = np.minimum(y, xr)
                if xr.any() and ((k, tuple(xr)) not in cut or cut[(k, tuple(xr))].sum() < yr.sum()):
                    cut[(k, tuple(xr))] = yr
            for k, (g, alone, kv, room) in enumerate(self.kinds):  # single sessions
                for c in np.nonzero(rest)[0]:
                    if alone[c] <= T * (1 + 1e-12) and np.all(kv[:, c] <= room):
                        e = np.zeros(len(counts), dtype=np.int64)
                        e[c] = 1
                        if (k, tuple(e)) not in cut:
                            cut[(k, tuple(e))] = e * int(alone[c] <= self.dl[c] * (1 + 1e-9))
            extra = cover_mip([(k, np.array(x), y, self._load(k, np.array(x))) for (k, x), y in cut.items()],
                              rest, gpus, [kd[0] for kd in self.kinds], deadline)
            if extra is not None:
                return [(k, x) for k, x, _ in base] + extra
        return cover_mip([(k, x, y, load) for k, x, on, load, y in cols], counts, self.G,
                         [kd[0] for kd in self.kinds], deadline)

    def lp_solution(self, T: float) -> list[tuple[float, int, np.ndarray, np.ndarray]]:
        """(λ, kind, x, y) of the restricted master over the pool's configurations of load ≤ T
        (positive λ only; empty when the master is not solved to optimality)."""
        import highspy

        from optimizer.highs import new_highs, single_thread

        cols = [c for c in self.pool if c[3] <= T * (1 + 1e-12)]
        C = len(self.counts)
        h = new_highs()
        single_thread(h)
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        inf = highspy.kHighsInf
        for c in range(C):
            h.addCol(-SLACK_PENALTY, 0.0, inf, 0, np.array([], dtype=np.int32), np.array([]))
        h.addRows(C + 1, np.concatenate([self.counts, [-inf]]), np.concatenate([self.counts, [self.G]]),
                  C, np.arange(C + 1, dtype=np.int32), np.arange(C, dtype=np.int32), np.ones(C))
        for k, x, on, load, y in cols:
            idx = np.nonzero(x)[0]
            h.addCol(on, 0.0, inf, len(idx) + 1, np.concatenate([idx, [C]]).astype(np.int32),
                     np.concatenate([x[idx].astype(float), [float(self.kinds[k][0])]]))
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return []
        lam = np.array(h.getSolution().col_value)[C:]
        return [(float(lam[j]), cols[j][0], cols[j][1], cols[j][4]) for j in range(len(cols)) if lam[j] > 1e-9]


def cover_mip(cols, rhs: np.ndarray, gpus: float, kind_gpus: list, deadline: float):
    """Integer master (HiGHS MIP until ``deadline``): λ_j copies of configuration
    j = (kind, x, y, load) (x sessions per class, y of them on time, load its makespan s), most
    sessions on time (then the least load), every class covered at least ``rhs`` times within
    ``gpus`` GPUs (``kind_gpus``: GPUs per kind); extra copies are then dropped, late ones
    first. Returns (kind, x) per instance, or None (no integer solution in time)."""
    import highspy

    from optimizer.highs import new_highs, single_thread

    C, J = len(rhs), len(cols)
    if not J or time.perf_counter() >= deadline:
        return None
    top = max(max(c[3] for c in cols), 1e-12)
    h = new_highs()
    single_thread(h)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = J, C + 1
    lp.col_cost_ = np.array([float(np.sum(y)) - 1e-6 * load / top for k, x, y, load in cols])
    lp.col_lower_ = np.zeros(J)
    lp.col_upper_ = np.full(J, highspy.kHighsInf)
    lp.row_lower_ = np.concatenate([rhs.astype(float), [-highspy.kHighsInf]])
    lp.row_upper_ = np.concatenate([np.full(C, highspy.kHighsInf), [float(gpus)]])
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.integrality_ = [highspy.HighsVarType.kInteger] * J
    starts, idx, vals = [0], [], []
    for k, x, y, load in cols:
        nz = np.nonzero(x)[0]
        idx += list(nz) + [C]
        vals += list(np.asarray(x)[nz].astype(float)) + [float(kind_gpus[k])]
        starts.append(len(idx))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(idx, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(vals)
    h.passModel(lp)
    h.setOptionValue("time_limit", max(0.01, deadline - time.perf_counter()))
    h.run()
    if not h.getInfo().primal_solution_status:
        return None
    lam = np.round(np.array(h.getSolution().col_value)).astype(int)
    insts = [(cols[j][0], np.array(cols[j][1]).copy(), np.array(cols[j][2]).copy())
             for j in range(J) for _ in range(max(0, lam[j]))]
    if not insts:
        return None
    extra = np.sum([x for _, x, _ in insts], axis=0) - rhs.astype(np.int64)
    for c in np.nonzero(extra > 0)[0]:  # drop extra copies: late ones first, then on-time
        for late in (True, False):
            for n in range(len(insts)):
                k, x, y = insts[n]
                while extra[c] > 0 and x[c] > 0 and (x[c] > y[c] or not late):
                    x[c] -= 1
                    y[c] = min(y[c], x[c])
                    extra[c] -= 1
    if np.any(extra != 0):
        return None
    return [(k, x) for k, x, _ in insts if x.any()]
