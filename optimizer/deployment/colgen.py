"""Configuration LP by column generation: a bound on the on-time sessions at a makespan
threshold, tighter than the fluid LP of :class:`~optimizer.deployment.anytime.BoundLP`.

A *configuration* is one instance: a kind k (layout, g_k GPUs) and how many sessions x_c of each
class it runs, y_c of them on time. One session at a time it is feasible at makespan T when
``Σ_c alone_kc·x_c ≤ T`` (no idle time), its sessions' KV fits every GPU
(``Σ_c kv_kc·x_c ≤ room_k`` per pipeline stage, all of them resident for the run) and its on-time
sessions meet their deadlines in deadline order (Jackson: for every deadline d,
``Σ_{d_c ≤ d} alone_kc·y_c ≤ d``); late sessions run after them, so Moore-Hodgson reaches that
on-time count. Batched kinds use a relaxation of the simulated timeline (a step of b sessions
costs at least ``w + Σ KV reads + σ·(b − 1)``, σ from
:func:`~optimizer.deployment.params.session_step_floor`; valid for every batch
limit and admission order of :mod:`optimizer.deployment.batching`; see
:meth:`ConfigLP.batched_load`), so their columns may include configurations no instance
reaches, never the other way round. The master LP chooses λ_j ≥ 0 instances of each
configuration j:

    max Σ_j on_j·λ_j   s.t.  Σ_j x_jc·λ_j = count_c (every class),  Σ_j g_j·λ_j ≤ G.

Columns come from pricing: per kind, the integer program above with objective
``Σ y_c − Σ π_c·x_c`` (π: duals of the class rows) solved by HiGHS. For any duals π,
``UB(π) = Σ π_c·count_c + G·max(0, max_k δ_k(π)/g_k)`` (δ_k: the pricing MIP's dual bound of kind
k) bounds the on-time count of every plan with makespan ≤ T (Lagrangian relaxation of the class
rows; at the restricted master's duals this is Farley's bound, Lübbecke and Desrosiers 2005,
"Selected topics in column generation"), so the bound is valid after any number of iterations
and reaches the master's optimum when pricing finds nothing better.
The restricted master carries a penalised slack per class (uncovered
sessions), so an uncovered session may simply pay; "no plan at T" is claimed only when a
phase-1 master (maximise −uncovered) has a negative bound.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from optimizer.deployment.params import ConfigKind, config_kinds

CG_MAX_CLASSES = 64  # the configuration LP is built up to this many classes
SLACK_PENALTY = 2.0  # cost of an uncovered session in the restricted master (finite: phase 1 decides feasibility)
PRICE_GAP = 1e-6  # relative MIP gap of the pricing problems
URGENT_SLACK = 1.5  # batched: classes with deadline ≤ this × their fastest single-session time are urgent


class _Mip:
    """A small HiGHS MIP built row by row (maximisation)."""

    def __init__(self):
        self.lo, self.hi, self.cost, self.integer = [], [], [], []
        self.rows: list[tuple[dict, float, float]] = []

    def var(self, lo: float, hi: float, cost: float, integer: bool = True) -> int:
        self.lo.append(lo); self.hi.append(hi); self.cost.append(cost); self.integer.append(integer)
        return len(self.lo) - 1

    def row(self, coefs: dict, hi: float, lo: float = -math.inf) -> None:
        self.rows.append((coefs, lo, hi))

    def solve(self, deadline: float):
        """Maximise until ``deadline``: (solution or None, dual bound of the objective), or None
        when infeasible."""
        import highspy

        from optimizer.highs import new_highs, single_thread

        nv, nr = len(self.lo), len(self.rows)
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = nv, nr
        lp.col_cost_ = np.array(self.cost, dtype=float)
        lp.col_lower_ = np.array(self.lo, dtype=float)
        lp.col_upper_ = np.array(self.hi, dtype=float)
        lp.row_lower_ = np.array([r[1] for r in self.rows], dtype=float)
        lp.row_upper_ = np.array([r[2] for r in self.rows], dtype=float)
        lp.sense_ = highspy.ObjSense.kMaximize
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in self.integer]
        trip = sorted((j, i, float(v)) for i, (coefs, _, _) in enumerate(self.rows) for j, v in coefs.items() if v != 0)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        cols = np.array([t[0] for t in trip], dtype=np.int64)
        lp.a_matrix_.start_ = np.searchsorted(cols, np.arange(nv + 1)).astype(np.int32)
        lp.a_matrix_.index_ = np.array([t[1] for t in trip], dtype=np.int32)
        lp.a_matrix_.value_ = np.array([t[2] for t in trip], dtype=float)
        h = new_highs()
        single_thread(h)
        h.passModel(lp)
        h.setOptionValue("mip_rel_gap", PRICE_GAP)
        h.setOptionValue("mip_abs_gap", 1e-9)
        h.setOptionValue("time_limit", max(0.01, deadline - time.perf_counter()))
        h.run()
        if h.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
            return None
        info = h.getInfo()
        dual = float(info.mip_dual_bound)
        if not math.isfinite(dual):  # the trivial bound
            dual = float(np.sum(np.maximum(lp.col_cost_, 0) * np.where(np.isfinite(lp.col_upper_), lp.col_upper_, 0)))
            if np.any((lp.col_cost_ > 0) & ~np.isfinite(lp.col_upper_)):
                dual = math.inf
        sol = np.array(h.getSolution().col_value) if info.primal_solution_status else None
        return sol, dual


class _Master:
    """The restricted master LP in HiGHS: a slack column per class (uncovered sessions, at
    ``slack_cost`` each), the class rows ``= count_c`` and the GPU row ``≤ G``; configurations
    are added as columns with objective ``weight × on time``."""

    def __init__(self, lp: "ConfigLP", slack_cost: float, weight: float):
        import highspy

        from optimizer.highs import new_highs, single_thread

        self.lp, self.weight, self.C = lp, weight, len(lp.counts)
        self.cols: list = []
        C = self.C
        h = self.h = new_highs()
        single_thread(h)
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        inf = self.inf = highspy.kHighsInf
        for c in range(C):
            h.addCol(-slack_cost, 0.0, inf, 0, np.array([], dtype=np.int32), np.array([]))
        h.addRows(C + 1, np.concatenate([lp.counts, [-inf]]), np.concatenate([lp.counts, [lp.G]]),
                  C, np.arange(C + 1, dtype=np.int32), np.arange(C, dtype=np.int32), np.ones(C))
        if h.getNumRow() != C + 1:
            raise RuntimeError("configuration LP: rows not added")

    def push(self, col) -> None:
        """Add a pool entry (kind, x, on time, load, y) as a column."""
        k, x, on, load, _ = col
        idx = np.nonzero(x)[0]
        self.h.addCol(self.weight * on, 0.0, self.inf, len(idx) + 1, np.concatenate([idx, [self.C]]).astype(np.int32),
                      np.concatenate([x[idx].astype(float), [float(self.lp.kinds[k].gpus)]]))
        self.cols.append(col)

    def solve(self) -> bool:
        """Solve; True when optimal."""
        import highspy

        self.h.run()
        self.lp.solves += 1
        return self.h.getModelStatus() == highspy.HighsModelStatus.kOptimal


class ConfigLP:
    """Column generation over the configurations of one problem.

    Args:
        counts: sessions per class [C]; dl: deadline per class (s, inf: none) [C]; new: new
            tokens per class [C].
        kinds: :class:`~optimizer.deployment.params.ConfigKind` per kind. gpus: GPUs available.
        urgent: (d*, ν0) of the batched window rows, or None.
    """

    def __init__(self, counts: np.ndarray, dl: np.ndarray, kinds: list, gpus: int,
                 new: Optional[np.ndarray] = None, urgent: Optional[tuple[float, float]] = None):
        self.counts = np.asarray(counts, dtype=float)
        self.dl = np.asarray(dl, dtype=float)
        self.new = np.zeros(len(self.counts)) if new is None else np.asarray(new, dtype=float)
        self.kinds = kinds
        self.G = float(gpus)
        self.urgent = urgent
        self.pool: list[tuple[int, np.ndarray, float, float, np.ndarray]] = []  # (kind, x, on time, load s, y)
        self._keys: set = set()
        self.solves = 0

    @classmethod
    def for_problem(cls, problem, kinds) -> Optional["ConfigLP"]:
        """The configuration LP of ``problem`` with the :class:`~optimizer.deployment.params.Kind`
        list ``kinds``, or None (more than CG_MAX_CLASSES classes). Batched kinds get the
        relaxation of :meth:`batched_load`; d* is the largest deadline of an *urgent* class
        (deadline ≤ URGENT_SLACK × its fastest single-session time on a batched kind)."""
        classes = problem.classes
        if not kinds or len(classes) > CG_MAX_CLASSES:
            return None
        counts = np.array([c.count for c in classes], dtype=float)
        dl = np.array([c.deadline_s if c.deadline_s is not None else np.inf for c in classes])
        new = np.array([c.new for c in classes], dtype=float)
        ks = config_kinds(problem, kinds)
        urgent = None
        batched = [kd for kd in ks if kd.batched]
        if batched:
            fastest = np.min([kd.alone for kd in batched], axis=0)
            hot = np.isfinite(dl) & np.isfinite(fastest) & (dl <= URGENT_SLACK * fastest)
            if hot.any():
                ds = float(dl[hot].max())
                urgent = (ds, float(new[dl <= ds].min()))
        return cls(counts, dl, ks, problem.total_gpus, new, urgent)

    def add(self, k: int, x: np.ndarray, y: np.ndarray) -> float:
        """Put a configuration (kind, sessions per class, of them on time) in the pool; returns
        its load (s; inf when it is not added: already there, empty or infeasible)."""
        x = np.round(x).astype(np.int64)
        y = np.minimum(np.round(y).astype(np.int64), x)
        key = (k, tuple(x), tuple(y))
        if key in self._keys or not x.any():
            return math.inf
        self._keys.add(key)
        load = self._load(k, x, y)
        if math.isfinite(load):
            self.pool.append((k, x, float(y.sum()), load, y))
        return load

    def _load(self, k: int, x: np.ndarray, y: Optional[np.ndarray] = None) -> float:
        """Least makespan threshold (s) at which configuration x (y on time) of kind k is a
        column: its sessions one after another, or :meth:`batched_load`."""
        kd = self.kinds[k]
        if kd.batched:
            return self.batched_load(k, x, np.zeros_like(x) if y is None else y)
        return float(np.sum(np.where(x > 0, kd.alone, 0.0) * x))

    def _at(self, T: float) -> list:
        """The pool's configurations of load ≤ T (s)."""
        return [c for c in self.pool if c[3] <= T * (1 + 1e-12)]

    def add_plan(self, columns) -> None:
        """Put a plan's instances, (kind, sessions per class, of them on time) each, in the pool."""
        for k, x, y in columns:
            self.add(k, np.asarray(x), np.asarray(y))

    # -------------------------------------------------------------- pricing
    def _pricing_mip(self, k: int, T: float, pi: np.ndarray, weight: float = 1.0):
        """The pricing MIP of kind k at makespan T (objective weight·Σ y − Σ π·x): (mip, X, Y)
        with X, Y the variables of x_c and y_c by class, or None when no session fits."""
        kd = self.kinds[k]
        C = len(self.counts)
        alone = kd.alone
        ok = np.isfinite(alone) & (alone <= T * (1 + 1e-12))
        if not ok.any():
            return None
        cols = [c for c in range(C) if ok[c]]
        ycan = [c for c in cols if alone[c] <= self.dl[c] * (1 + 1e-9)]
        m = _Mip()
        # one at a time at most T/alone sessions of a class; batched, memory decides
        X = {c: m.var(0.0, float(self.counts[c] if kd.batched else
                                 min(self.counts[c], math.floor(T * (1 + 1e-12) / alone[c]))), -pi[c]) for c in cols}
        Y = {c: m.var(0.0, float(self.counts[c]), weight) for c in ycan}
        for c in ycan:  # y_c ≤ x_c
            m.row({Y[c]: 1.0, X[c]: -1.0}, 0.0)
        for s in range(kd.kv.shape[0]):  # memory per stage, as shares of the room (in bytes
            scale = max(abs(float(kd.room[s])), 1.0)  # HiGHS's MIP can stall on the bad scaling)
            m.row({X[c]: float(kd.kv[s, c]) / scale for c in cols}, float(kd.room[s]) / scale)
        if not kd.batched:
            m.row({X[c]: float(alone[c]) for c in cols}, T * (1 + 1e-12))
            for dv in np.unique(self.dl[ycan]) if ycan else ():  # Jackson: on time in deadline order
                if math.isfinite(dv):
                    m.row({Y[c]: float(alone[c]) for c in ycan if self.dl[c] <= dv}, dv * (1 + 1e-9))
        else:
            self._batched_rows(m, kd, T, cols, ycan, X, Y)
        return m, X, Y

    def admits(self, k: int, T: float, x: np.ndarray, y: np.ndarray, deadline: float) -> bool:
        """Whether the pricing MIP of kind k at makespan T admits configuration (x, y) (for
        tests: every configuration an instance reaches must be admitted)."""
        built = self._pricing_mip(k, T, np.zeros(len(self.counts)))
        if built is None:
            return False
        m, X, Y = built
        for c in range(len(self.counts)):
            for V, v in ((X, x[c]), (Y, y[c])):
                if c in V:
                    m.lo[V[c]] = m.hi[V[c]] = float(v)
                elif v:
                    return False
        return m.solve(deadline) is not None

    def _price(self, k: int, T: float, pi: np.ndarray, deadline: float, weight: float = 1.0):
        """Best configuration of kind k for duals ``pi``: (x, y, dual bound of weight·Σ y − Σ π·x)
        or None (nothing fits); x and y None when the MIP found no solution in time (the dual
        bound still holds)."""
        built = self._pricing_mip(k, T, pi, weight)
        if built is None:
            return None
        m, X, Y = built
        C = len(self.counts)
        got = m.solve(deadline)
        self.solves += 1
        if got is None:
            return None
        sol, dual = got
        if sol is None:
            return None, None, dual
        x = np.zeros(C)
        y = np.zeros(C)
        for c, v in X.items():
            x[c] = round(sol[v])
        for c, v in Y.items():
            y[c] = round(sol[v])
        return x, y, dual

    def _batched_rows(self, m: "_Mip", kd, T: float, cols, ycan, X, Y) -> None:
        """Rows of a batched configuration (a relaxation of :mod:`optimizer.deployment.batching`;
        module docstring of :meth:`batched_load`)."""
        new, work = self.new, kd.work
        tokens = float(np.sum(new * self.counts))
        n_all = float(np.sum(self.counts))
        G = {c: m.var(0.0, 1.0, 0.0, True) for c in cols}  # class c present
        S = m.var(0.0, math.inf, 0.0, False)  # steps
        for c in cols:
            m.row({X[c]: 1.0, G[c]: -float(self.counts[c])}, 0.0)
            m.row({G[c]: float(new[c]), S: -1.0}, 0.0)  # S ≥ new_c if present
        m.row({**{X[c]: float(work[c]) for c in cols}, S: kd.w}, T * (1 + 1e-12))
        H = {c: m.var(0.0, 1.0, 0.0, True) for c in ycan}  # an on-time session of class c
        for c in ycan:
            m.row({Y[c]: 1.0, H[c]: -float(self.counts[c])}, 0.0)
        for dv in np.unique(self.dl[ycan]) if ycan else ():
            if not math.isfinite(dv):
                continue
            early = [c for c in ycan if self.dl[c] <= dv]
            for c in early:  # the on-time sessions of deadline ≤ dv finish by dv: ≥ new_c steps
                m.row({**{Y[c2]: float(work[c2]) for c2 in early}, H[c]: kd.w * float(new[c])}, dv * (1 + 1e-9))
        # batch limit: all sessions at once (b ≥ n, n ≤ cap) or a queue behind b < n
        A = m.var(0.0, 1.0, 0.0, True)
        U = {b: m.var(0.0, 1.0, 0.0, True) for b in kd.queue_limits}
        m.row({A: 1.0, **{U[b]: 1.0 for b in U}}, 1.0, 1.0)
        m.row({**{X[c]: 1.0 for c in cols}, A: n_all}, kd.cap + n_all)
        for b, ub in U.items():
            m.row({**{X[c]: -1.0 for c in cols}, ub: float(b + 1)}, 0.0)  # n ≥ b + 1
            m.row({**{X[c]: float(new[c]) for c in cols}, S: -float(b), ub: tokens}, tokens)  # b·S ≥ Σ new
        if self.urgent is None:
            return
        ds, nu0 = self.urgent
        D = [c for c in ycan if self.dl[c] <= ds]
        if not D:
            return
        E = m.var(0.0, 1.0, 0.0, True)  # an on-time session of deadline ≤ d*
        for c in D:
            m.row({Y[c]: 1.0, E: -float(self.counts[c])}, 0.0)
        kv1 = kd.kv1
        lag = {c: float(kv1[c] * min(new[c], nu0)) for c in cols}
        big = float(sum(lag[c] * self.counts[c] + work[c] * self.counts[c] for c in cols)) + kd.w * nu0
        # all at once: every other session reads for min(new, ν0) steps of the window
        row = {X[c]: lag[c] for c in cols}
        for c in D:
            row[Y[c]] = row.get(Y[c], 0.0) + float(work[c]) - lag[c]
        row[E] = kd.w * nu0 + big
        row[A] = big
        m.row(row, ds * (1 + 1e-9) + 2 * big)
        # queue: ≥ b·ν0 − idle − ν0·|D| slot-steps of other sessions, each at least its kv1, at
        # most min(new, ν0) per session; idle (:meth:`_idle`): Q sessions' (ν0 − new), the
        # longest of the short sessions first (Z: class fully taken), Q ≤ b − #long or none (W)
        SG = {c: m.var(0.0, math.inf, 0.0, False) for c in cols}
        for c in cols:
            r = {SG[c]: 1.0, X[c]: -min(float(new[c]), nu0)}
            if c in D:
                r[Y[c]] = min(float(new[c]), nu0)
            m.row(r, 0.0)
        short = sorted((c for c in cols if new[c] < nu0), key=lambda c: -new[c])
        Q = {c: m.var(0.0, math.inf, 0.0, False) for c in short}
        for c in short:
            m.row({Q[c]: 1.0, X[c]: -1.0}, 0.0)
        z_prev = None
        for c, c2 in zip(short, short[1:]):
            z = m.var(0.0, 1.0, 0.0, True)
            m.row({X[c]: 1.0, Q[c]: -1.0, z: float(self.counts[c])}, float(self.counts[c]))  # z → Q_c = x_c
            m.row({Q[c2]: 1.0, z: -float(self.counts[c2])}, 0.0)  # Q_c2 > 0 → z
            if z_prev is not None:
                m.row({z: 1.0, z_prev: -1.0}, 0.0)  # and every longer class fully taken
            z_prev = z
        W = m.var(0.0, 1.0, 0.0, True)
        m.row({**{Q[c]: 1.0 for c in short}, **{X[c]: 1.0 for c in cols if new[c] >= nu0},
               **{ub: -float(b) for b, ub in U.items()}, W: -n_all}, 0.0)
        m.row({**{Q[c]: 1.0 for c in short}, W: n_all}, n_all)
        top = max(kd.queue_limits, default=0) * nu0
        r = {SG[c]: -1.0 for c in cols}
        for b, ub in U.items():
            r[ub] = r.get(ub, 0.0) + b * nu0
        for c in short:
            r[Q[c]] = -(nu0 - float(new[c]))
        for c in D:
            r[Y[c]] = r.get(Y[c], 0.0) - nu0
        r[E] = top
        m.row(r, top)
        m.row({**{Y[c]: float(work[c]) for c in D}, **{SG[c]: float(kv1[c]) for c in cols}, E: kd.w * nu0},
              ds * (1 + 1e-9))

    def batched_load(self, k: int, x: np.ndarray, y: np.ndarray) -> float:
        """Least makespan threshold (s) at which the relaxation of :meth:`_batched_rows` admits
        configuration (x, y) on batched kind k (inf: none).

        Valid for every instance of the search space (EDD admission, batch limit b from
        :func:`~optimizer.deployment.batching.batch_limits`): a step takes at least
        ``w + Σ KV reads of its active sessions``, a session reads ``work_c`` over its steps and
        at least kv1_c per step; S steps with ``S ≥ max new`` and ``b·S ≥ Σ new``; the on-time
        sessions of deadline ≤ d finish by d after ≥ their longest decode in steps. With d* (the
        urgent deadline) and ν0 (the shortest decode of a class with deadline ≤ d*), the on-time
        sessions D of deadline ≤ d* finish by d* after ≥ ν0 steps, during which either every
        session runs (b ≥ n: the others read ``kv1·min(new, ν0)`` each) or at least
        ``b·ν0 − idle − ν0·|D|`` slot-steps of other sessions run (b < n; idle: :meth:`_idle`)."""
        kd = self.kinds[k]
        new, work = self.new, kd.work
        present = x > 0
        if np.any(~np.isfinite(kd.alone[present])):
            return math.inf
        for dv in np.unique(self.dl[y > 0]):
            early = (self.dl <= dv) & (y > 0)
            if float(work[early] @ y[early]) + kd.w * float(new[early].max()) > dv * (1 + 1e-9):
                return math.inf
        n, maxnew, tok = float(x.sum()), float(new[present].max()), float(new @ x)
        modes = ([("all", None)] if n <= kd.cap else []) + [("queue", b) for b in kd.queue_limits if n >= b + 1]
        best = math.inf
        for mode, b in modes:
            if self.urgent is not None and not self._window_ok(kd, x, y, mode, b):
                continue
            steps = maxnew if mode == "all" else max(maxnew, tok / b)
            best = min(best, float(work @ x) + kd.w * steps)
        return best

    def _window_ok(self, kd, x, y, mode, b) -> bool:
        """The urgent-window condition of :meth:`batched_load` for one batch-limit mode."""
        ds, nu0 = self.urgent
        new, kv1 = self.new, kd.kv1
        D = (self.dl <= ds) & (y > 0)
        if not D.any():
            return True
        yd = np.where(D, y, 0)
        own = float(kd.work[D] @ y[D]) + kd.w * nu0
        if mode == "all":
            return own + float(np.sum(kv1 * np.minimum(new, nu0) * (x - yd))) <= ds * (1 + 1e-9)
        need = b * nu0 - self._idle(x, b) - nu0 * float(yd.sum())
        reads = 0.0
        for c in np.argsort(kv1):  # the cheapest slot-steps first
            if need <= 0:
                break
            take = min(need, min(float(new[c]), nu0) * float(x[c] - yd[c]))
            reads += take * float(kv1[c])
            need -= take
        if need > 1e-9:
            return False
        return own + reads <= ds * (1 + 1e-9)

    def _idle(self, x: np.ndarray, b: int) -> float:
        """Most idle slot-steps in the first ν0 steps of configuration x under batch limit b < n.
        A slot idles only once the queue is empty, i.e. after the first n − b finishes, and then
        from the finish to step ν0; the i-th finish (in time) is at step ≥ the i-th smallest
        new-token count, so idle ≤ Σ_{i ≥ n−b} (ν0 − new_(i))⁺ over the sessions' new-token
        counts sorted ascending (0-based): the longest of the sessions shorter than ν0 count."""
        nu0 = self.urgent[1]
        news = np.sort(np.repeat(self.new, np.asarray(x, dtype=np.int64)))
        return float(np.sum(np.maximum(nu0 - news[max(0, len(news) - int(b)):], 0.0)))

    # -------------------------------------------------------------- master
    def upper(self, T: float, deadline: float) -> Optional[float]:
        """Upper bound on the on-time sessions of any plan with makespan ≤ T (s); −1 when no
        plan fits (proven by a phase-1 master whose bound on −(uncovered sessions) is
        negative); None when no bound was reached before ``deadline`` (a
        ``time.perf_counter()`` value)."""
        ub, slack, done = self._run(T, deadline, False)
        if done and slack > 1e-6:
            # sessions left uncovered may only pay (the penalty is finite): is any cover possible?
            p1, _, _ = self._run(T, deadline, True)
            if p1 is not None and p1 < -1e-7:
                return -1.0
        return ub

    def _run(self, T: float, deadline: float, phase1: bool) -> tuple[Optional[float], float, bool]:
        """Column generation at T: (least bound found or None, uncovered sessions of the last
        master, converged). Phase 1 maximises −(uncovered sessions) instead of the on-time count
        (uncovered sessions cost SLACK_PENALTY each otherwise).

        The bound of any priced duals π is valid (Lagrangian relaxation of the class rows):
        ``UB(π) = π·count + G·max(0, max_k δ_k(π)/g_k)`` with δ_k the pricing MIP's dual bound.
        (Wentges' dual smoothing was measured and dropped: 1.6x slower to converge on the
        12-class cases, and far from convergence on 200 classes either way.)"""
        C = len(self.counts)
        weight = 0.0 if phase1 else 1.0  # objective per on-time session
        m = _Master(self, 1.0 if phase1 else SLACK_PENALTY, weight)
        h = m.h
        used = 0
        best, slack = None, math.inf
        while True:
            for col in self.pool[used:]:
                if col[3] <= T * (1 + 1e-12):
                    m.push(col)
            used = len(self.pool)
            if not m.solve():
                return best, slack, False
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
            got = self._price_all(T, pi, sigma, deadline, weight)
            if got is None:  # out of time before every kind was priced
                return best, slack, False
            ub, added = got
            best = ub if best is None else min(best, ub)
            if not added:
                return best, slack, True
            if time.perf_counter() >= deadline:
                return best, slack, False

    def _price_all(self, T: float, pi: np.ndarray, sigma: float, deadline: float,
                   weight: float) -> Optional[tuple[float, bool]]:
        """Price every kind at the master's duals (π, σ): (the bound UB(π) of :meth:`_run`,
        whether a configuration with positive reduced profit was added), or None when the
        deadline passed before every kind was priced."""
        rise = 0.0
        added = False
        for k, kd in enumerate(self.kinds):
            if time.perf_counter() >= deadline:
                return None
            got = self._price(k, T, pi, deadline, weight)
            if got is None:
                continue
            x, y, dual = got
            rise = max(rise, dual / kd.gpus)
            if x is not None and weight * float(np.sum(y)) - float(pi @ x) - sigma * kd.gpus > 1e-7:
                added |= self.add(k, x, y) <= T * (1 + 1e-12)
        return float(pi @ self.counts) + rise * self.G, added

    def integer_plan(self, T: float, deadline: float) -> Optional[list[tuple[int, np.ndarray]]]:
        """Instances (kind, sessions per class) of load ≤ T from the pool (a price-and-branch
        heuristic, no optimality claim): the restricted master's LP solution rounded down, the
        sessions left over covered by an integer master on the GPUs left (the pool's
        configurations cut down to them, and single sessions); if that fails, one integer master
        over the pool for all sessions. None when neither finds a plan before ``deadline``."""
        cols = self._at(T)
        if not cols:
            return None
        counts = self.counts.astype(np.int64)
        base = [(k, x.copy(), y.copy()) for lam, k, x, y in self.lp_solution(T) for _ in range(int(math.floor(lam + 1e-9)))]
        rest = counts - (np.sum([x for _, x, _ in base], axis=0) if base else 0)
        gpus = self.G - sum(self.kinds[k].gpus for k, _, _ in base)
        if base and np.all(rest >= 0) and gpus >= 0:
            if not rest.any():
                return [(k, x) for k, x, _ in base]
            cut = {}  # (kind, x) -> y with the most on time
            for k, x, on, load, y in cols:
                xr = np.minimum(x, rest)
                yr = np.minimum(y, xr)
                if xr.any() and ((k, tuple(xr)) not in cut or cut[(k, tuple(xr))].sum() < yr.sum()):
                    cut[(k, tuple(xr))] = yr
            for k, kd in enumerate(self.kinds):  # single sessions
                alone = kd.alone
                for c in np.nonzero(rest)[0]:
                    if alone[c] <= T * (1 + 1e-12) and np.all(kd.kv[:, c] <= kd.room):
                        e = np.zeros(len(counts), dtype=np.int64)
                        e[c] = 1
                        if (k, tuple(e)) not in cut:
                            cut[(k, tuple(e))] = e * int(alone[c] <= self.dl[c] * (1 + 1e-9))
            sub = [(k, np.array(x), y, self._load(k, np.array(x), y)) for (k, x), y in cut.items()]
            extra = cover_mip([c for c in sub if math.isfinite(c[3])],
                              rest, gpus, [kd.gpus for kd in self.kinds], deadline)
            if extra is not None:
                return [(k, x) for k, x, _ in base] + extra
        return cover_mip([(k, x, y, load) for k, x, on, load, y in cols], counts, self.G,
                         [kd.gpus for kd in self.kinds], deadline)

    def lp_solution(self, T: float) -> list[tuple[float, int, np.ndarray, np.ndarray]]:
        """(λ, kind, x, y) of the restricted master over the pool's configurations of load ≤ T
        (positive λ only; empty when the master is not solved to optimality)."""
        m = _Master(self, SLACK_PENALTY, 1.0)
        for col in self._at(T):
            m.push(col)
        if not m.solve():
            return []
        lam = np.array(m.h.getSolution().col_value)[len(self.counts):]
        return [(float(lam[j]), col[0], col[1], col[4]) for j, col in enumerate(m.cols) if lam[j] > 1e-9]

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
