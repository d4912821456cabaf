"""Layouts and batched decode (continuous batching) in the configuration search.

Semantics (what the independent evaluator simulates, :func:`optimizer.deployment.evaluate`):
an instance with layout L and batch limit b holds every session assigned to it in memory for
the whole run (eq. 6-1; with attention DP the i-th session in admission order lives on DP
rank ``i mod dp``). Sessions start in the instance's admission order as soon as one of the b
slots is free; every step advances each active session by one token (a session at position s
reads s+1 tokens of KV); a session finishes at the end of the step that produces its last token
and frees its slot at that step boundary. A step of the active set A takes the shared model's
batched :meth:`optimizer.model.perf.PerfModel.step` time (|A| = 1: the single-session time,
exactly as the TP-only problem).

Search space: a *configuration* is (layout, batch limit b, multiset of session classes) that
fits the memory of one instance, with an admission order. Its timeline is a deterministic
simulation once the order is fixed. With batching the order is a decision (earliest-deadline
admission is not optimal: a long session admitted early can be the only way to finish it on
time), so it is searched exactly where the instance is small enough:

* **Exact orders** for every configuration of at most :attr:`Enumeration.exact_sessions`
  sessions: every batch limit ``1 .. min(n, max_batch)`` and every distinct admission order of
  its sessions, keeping the columns no other column of the same (layout, sessions) beats on
  makespan, on-time count and finish sum (every objective here is monotone in those three).
  ``exact_sessions`` is the largest n whose configurations fit :data:`ORDER_WORK` simulated
  timelines (smaller configurations first), so small instances are exact end to end.
* **By rule** above it: batch limits 1, the powers of two below n and n (capped by
  ``deployment.max_batch``); b = 1 in Moore-Hodgson order (on-time sessions by deadline, late
  ones after: optimal for the on-time count, and the makespan does not depend on the order);
  b > 1 earliest deadline first (no deadline last; ties: fewer new tokens, then shorter
  context). A result then states its claim under these rules (:attr:`Enumeration.scope`).

The configuration LP/MILP (:class:`~optimizer.deployment.configurations.ConfigurationSearch`)
chooses how many instances run each configuration, with the GPU row exact because every
layout's GPU count divides the server or is a multiple of it. The exhaustive test enumerates
every assignment, batch limit and admission order.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from optimizer.deployment.configurations import moore_hodgson_order
from optimizer.deployment.params import LayoutOption, layout_options, layout_reason
from optimizer.deployment.schema import Problem
from optimizer.deployment.units import ticks_down, ticks_up
from optimizer.errors import InputError
from optimizer.model.layout import Layout

MAX_BATCH_CONFIGURATIONS = 200_000
MEMO_SEGMENTS = 500_000  # cached timeline segments per performance model (cleared beyond)
# simulated timelines spent on exact admission orders per instance (~0.1 ms each on the 2-core
# machine, a few seconds at most); configurations beyond it keep the rule orders
ORDER_WORK = 40_000
# one recursion level per session class: beyond this the enumeration is refused (None, "too
# many"), well inside Python's recursion limit and far past what 200,000 columns can hold
MAX_RECURSION_CLASSES = 500


@dataclass(frozen=True)
class BatchConfiguration:
    """One column: ``degree`` is the GPU count (the GPU row of the search)."""

    degree: int
    counts: tuple[int, ...]
    load: int  # ticks, makespan of the simulated timeline (rounded up)
    on_time: int
    layout: Layout
    batch: int
    finish_sum: int = 0  # ticks, sum of the sessions' finish times (each rounded up)
    order: Optional[tuple[int, ...]] = None  # class index per admission position; None: the rule's order


class Enumeration(list):
    """The configurations (a list of :class:`BatchConfiguration`) and the decision space they cover.

    Attributes:
        exact_sessions: configurations of at most this many sessions carry every batch limit
            and admission order (the rule's beyond it).
        largest: the most sessions in any configuration.
    """

    exact_sessions: int = 0
    largest: int = 0

    @property
    def scope(self) -> str:
        """The restriction a claim of optimality or infeasibility holds under ("" = none)."""
        if self.largest <= self.exact_sessions:
            return ""
        return (f"earliest-deadline admission and batch limits 1, 2, 4, ..., n in replicas of more than "
                f"{self.exact_sessions} sessions")


def distinct_orders(counts: tuple[int, ...]) -> int:
    """Distinct admission orders of a multiset of classes: n! / prod(counts_i!)."""
    out = math.factorial(sum(counts))
    for c in counts:
        out //= math.factorial(c)
    return out


def pareto(cols: list[BatchConfiguration]) -> list[BatchConfiguration]:
    """The columns no other beats on (makespan, on-time count, finish sum); one per tie."""
    best: dict[tuple[int, int, int], BatchConfiguration] = {}
    for c in cols:
        best.setdefault((c.load, -c.on_time, c.finish_sum), c)
    keys = sorted(best)
    keep = []
    for k in keys:  # sorted by makespan: a column is dominated by one seen earlier
        if not any(o[1] <= k[1] and o[2] <= k[2] for o in keep):
            keep.append(k)
    return [best[k] for k in keep]


def batch_limits(n: int, cap: int) -> list[int]:
    """Batch limits tried for a configuration of ``n`` sessions: 1, powers of two below n, n;
    each capped by ``cap`` (``deployment.max_batch``)."""
    vals = {1, min(n, cap)}
    b = 2
    while b < n:
        vals.add(min(b, cap))
        b *= 2
    return sorted(vals)


def admission_order(jobs: list[tuple[int, int, Optional[float]]], single_ticks: list[int], batch: int) -> list[int]:
    """Admission order (indices into ``jobs`` = (context, new, deadline_s)) by the module's rule."""
    if batch == 1:
        on, late = moore_hodgson_order([(t, ticks_down(d) if d is not None else None)
                                        for t, (_, _, d) in zip(single_ticks, jobs)])
        late.sort(key=lambda i: (jobs[i][2] is None, jobs[i][2] or 0.0))
        return on + late
    return sorted(range(len(jobs)), key=lambda i: (jobs[i][2] is None, jobs[i][2] or 0.0, jobs[i][1], jobs[i][0], i))


def simulate(perf, lay: Layout, jobs: list[tuple[int, int]], batch: int) -> tuple[list[float], list[float]]:
    """Start and finish times (s) of ``jobs`` = [(context, new)] in admission order on one
    instance (module semantics), event by event: between two finishes the active set is fixed,
    so its steps are evaluated in one vectorised call (:class:`~optimizer.model.perf.BatchStepTable`)."""
    steps = perf.steps
    memo = steps.cache("segments")
    dp = lay.attention_dp
    n = len(jobs)
    start = [0.0] * n
    finish = [0.0] * n
    done = [0] * n
    active: list[int] = []
    nxt = 0
    t = 0.0
    while nxt < n and len(active) < batch:
        active.append(nxt); start[nxt] = t; nxt += 1
    while active:
        k = min(jobs[i][1] - done[i] for i in active)
        pos = tuple(jobs[i][0] + done[i] for i in active)
        rank = tuple(i % dp for i in active)
        key = (lay, pos, rank, k)
        dts = memo.get(key)
        if dts is None:  # the same segment recurs across configurations: compute it once
            if len(active) == 1:
                dts = steps.single_session_step_s(lay, pos[0] + np.arange(k))
            else:
                dts = steps.batch_steps_s(lay, np.array(pos, dtype=np.float64), k, rank=np.array(rank))
            if len(memo) > MEMO_SEGMENTS:
                memo.clear()
            memo[key] = dts
        t = float(np.cumsum(np.concatenate(([t], dts)))[-1])
        still = []
        for i in active:
            done[i] += k
            if done[i] == jobs[i][1]:
                finish[i] = t
            else:
                still.append(i)
        active = still
        while nxt < n and len(active) < batch:
            active.append(nxt); start[nxt] = t; nxt += 1
    return start, finish


def _column(problem, perf, lay: Layout, counts: tuple[int, ...], ordered_classes: list[int], b: int,
            mem_limit: float, rule: bool) -> Optional[BatchConfiguration]:
    """The column of ``counts`` on ``lay`` admitted in ``ordered_classes`` order at batch limit
    ``b``; None when the fullest DP rank does not fit the memory."""
    classes = problem.classes
    ordered = [(classes[i].context, classes[i].new, classes[i].deadline_s) for i in ordered_classes]
    if lay.attention_dp > 1:  # DP ranks follow the admission order: check the fullest rank exactly
        mem = perf.model.memory_per_gpu(lay, [(c, nw) for c, nw, _ in ordered],
                                        [i % lay.attention_dp for i in range(len(ordered))])
        if mem > mem_limit:
            return None
    _, fin = simulate(perf, lay, [(c, nw) for c, nw, _ in ordered], b)
    on = sum(1 for (_, _, d), f in zip(ordered, fin) if d is None or f <= d + 1e-9)
    return BatchConfiguration(lay.gpus, counts, ticks_up(max(fin)), on, lay, b, sum(ticks_up(f) for f in fin),
                              None if rule else tuple(ordered_classes))


def _order_work(counts: tuple[int, ...], cap_b: int, dp: int) -> int:
    """Timelines the exact pass simulates for one (layout, sessions): every order at every batch
    limit, one order when all sessions start at once on one rank (the order cannot matter)."""
    n = sum(counts)
    perms = distinct_orders(counts)
    return sum(1 if (b >= n and dp == 1) else perms for b in range(1, min(n, cap_b) + 1))


def _exact_columns(problem, perf, lay: Layout, counts: tuple[int, ...], mem_limit: float) -> list[BatchConfiguration]:
    """Every batch limit and distinct admission order of ``counts`` on ``lay``, Pareto-filtered
    (kept with the shared model's step table: the comparison rows ask again for the same layouts)."""
    from more_itertools import distinct_permutations

    memo = perf.steps.cache("exact_columns")
    key = (lay, tuple((c.context, c.new, c.deadline_s) for c in problem.classes), counts, problem.batch_cap, mem_limit)
    if key in memo:
        return memo[key]
    n = sum(counts)
    base = [i for i, k in enumerate(counts) for _ in range(k)]
    cols = []
    for b in range(1, min(n, problem.batch_cap) + 1):
        orders = [base] if (b >= n and lay.attention_dp == 1) else distinct_permutations(base)
        for o in orders:
            col = _column(problem, perf, lay, counts, list(o), b, mem_limit, rule=False)
            if col is not None:
                cols.append(col)
    memo[key] = pareto(cols)
    return memo[key]


def enumerate_batch_configurations(problem: Problem, perf, options: dict[Layout, LayoutOption],
                                   deadline: Optional[float] = None,
                                   limit: int = MAX_BATCH_CONFIGURATIONS,
                                   order_work: int = ORDER_WORK) -> Optional[Enumeration]:
    """Every (layout, batch limit, class multiset, admission order) column that fits one
    instance's memory (the module's search space; :class:`Enumeration` says up to which size
    the orders are exact); None when there are more than ``limit`` or the wall clock passes
    ``deadline`` first."""
    classes = problem.classes
    cap_b = problem.batch_cap
    single = {lay: [ticks_up(perf.steps.single_session_step_s(lay, np.arange(c.context, c.context + c.new)).sum())
                    for c in classes] for lay in options}
    out: list[BatchConfiguration] = []
    groups: list[tuple[Layout, tuple[int, ...], int, int]] = []  # (layout, counts, first, end) of rule columns
    mem_limit = problem.gpu.memory_bytes * (1 + 1e-12)
    for lay, opt in options.items():
        caps = list(opt.cap)
        if max(caps, default=0) == 0:
            continue
        counts = [0] * len(classes)
        dp = lay.attention_dp
        static, kv = perf.model.stage_memory_terms(lay, [(c.context, c.new) for c in classes])

        def leaf() -> bool:
            jobs = [(c.context, c.new, c.deadline_s) for c in classes for _ in range(counts[c.index])]
            ticks = [single[lay][c.index] for c in classes for _ in range(counts[c.index])]
            cls = [c.index for c in classes for _ in range(counts[c.index])]
            first = len(out)
            for b in batch_limits(len(jobs), cap_b):
                col = _column(problem, perf, lay, tuple(counts), [cls[i] for i in admission_order(jobs, ticks, b)],
                              b, mem_limit, rule=True)
                if col is not None:
                    out.append(col)
            groups.append((lay, tuple(counts), first, len(out)))
            return len(out) <= limit and (deadline is None or time.perf_counter() <= deadline)

        def rec(i: int, load: np.ndarray) -> bool:
            # load[stage]: Σ KV per GPU of the chosen sessions; every stage must hold the
            # fullest DP rank, which holds at least the average (exact when dp = 1)
            if i == len(classes):
                return leaf() if sum(counts) else True
            k = 0
            while k <= caps[i]:
                cur = load + k * kv[:, i]
                if np.any(static + cur / dp > mem_limit):
                    break
                counts[i] = k
                if not rec(i + 1, cur):
                    return False
                k += 1
            counts[i] = 0
            return True

        if len(classes) > MAX_RECURSION_CLASSES or not rec(0, np.zeros(len(static))):
            return None
    return _with_exact_orders(problem, perf, out, groups, mem_limit, order_work, deadline)


def _with_exact_orders(problem, perf, out, groups, mem_limit, order_work, deadline) -> Optional[Enumeration]:
    """Replace the rule columns of every configuration of at most K sessions by its exact
    columns, K the largest size whose configurations (all sizes up to K) fit ``order_work``
    timelines; deterministic (it depends on the instance, not the clock)."""
    res = Enumeration()
    res.largest = max((sum(g[1]) for g in groups), default=0)
    work: dict[int, int] = {}
    for lay, counts, _, _ in groups:
        n = sum(counts)
        work[n] = work.get(n, 0) + _order_work(counts, problem.batch_cap, lay.attention_dp)
    k, spent = 0, 0
    for n in sorted(work):
        if spent + work[n] > order_work:
            break
        spent += work[n]
        k = n
    # the comparison rows (one layout each) keep the main search's size: the same claim, and
    # no more exact work per row than the main search spent on all layouts
    sizes = perf.steps.cache("exact_sessions")
    key = (tuple((c.context, c.new, c.deadline_s, c.count) for c in problem.classes), problem.batch_cap, order_work)
    k = min(k, sizes.setdefault(key, k))
    res.exact_sessions = k
    for lay, counts, first, end in groups:
        if sum(counts) <= k:
            res.extend(_exact_columns(problem, perf, lay, counts, mem_limit))
            if deadline is not None and time.perf_counter() > deadline:
                return None
        else:
            res.extend(out[first:end])
    return res


def check_supported(problem: Problem, objective) -> None:
    """Batched decode and non-TP layouts are solved by the configuration search only.

    Raises:
        InputError: faults, or an objective without a configuration search, naming the field.
    """
    what = "deployment.max_batch" if problem.batch_cap > 1 else "deployment.layouts"
    why = (f"batched decode (max_batch {problem.max_batch or 'unlimited'})" if problem.batch_cap > 1
           else "non-TP layouts")
    verb = "is" if problem.batch_cap > 1 else "are"
    if problem.faults:
        raise InputError(problem.path, what, f"{why} {verb} not solved with faults yet; set deployment.max_batch: 1 "
                                             f"and TP layouts (deployment.tensor_parallel)")
    if objective.search is None and objective.column_cost(1, 1) is None:
        raise InputError(problem.path, what, f"{why} {verb} solved for objectives the configuration columns can "
                                             f"express (cost, makespan, energy, gpus, dollars, latency), not "
                                             f"'{objective.name}'; set deployment.max_batch: 1 and TP layouts for it")


def kv_per_gpu_rounded(x: float) -> int:
    return int(math.ceil(x))


def max_on_time_batched(problem: Problem, perf, time_limit_s: float) -> Optional[int]:
    """Most sessions that can finish on time with layouts and batching (the search space of this
    module), ignoring the on-time requirement: a MILP over every configuration maximising the
    on-time count. None when the sessions cannot all be placed (memory, GPUs) or the MILP is not
    solved to optimality within ``time_limit_s``."""
    from optimizer.deployment.configurations import ConfigurationSearch

    import highspy

    end = time.perf_counter() + time_limit_s
    options = layout_options(problem, perf, problem.layouts)
    configs = enumerate_batch_configurations(problem, perf, options, deadline=end) if options else []
    if not configs:
        return None
    if any(not any(cfg.counts[c.index] for cfg in configs) for c in problem.classes):
        return None
    search = ConfigurationSearch(problem, configs, 0, end)
    h, idx = search._model(np.arange(len(configs)), 0, True)
    h.setOptionValue("time_limit", max(0.05, end - time.perf_counter()))
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    x = np.round(np.array(h.getSolution().col_value))
    return int(round(float(sum(search.configs[j].on_time * v for j, v in zip(idx, x)))))


def milp_min(search, costs, need: int, deadline: float):
    """Minimise ``Σ costs_j · z_j`` over the search's configuration columns (same rows as the
    search: every session once, GPUs, on-time ≥ ``need``; ``costs`` in ``search.configs`` order).

    Returns:
        (status, counts, value, bound): status "optimal" | "feasible" | "infeasible" | "unknown";
        counts [(configuration, instances)] or None; the plan's objective and HiGHS's proven bound.
    """
    import highspy

    n = len(search.configs)
    h, idx = search._model(np.arange(n), need, True)
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.asarray(costs, dtype=float))
    h.setOptionValue("time_limit", max(0.05, deadline - time.perf_counter()))
    search.milp_solves += 1
    h.run()
    st = h.getModelStatus()
    if st == highspy.HighsModelStatus.kInfeasible:
        return "infeasible", None, None, None
    info = h.getInfo()
    if st != highspy.HighsModelStatus.kOptimal and info.primal_solution_status != 2:
        return "unknown", None, None, None
    x = np.round(np.array(h.getSolution().col_value))
    counts = [(search.configs[j], int(v)) for j, v in zip(idx, x) if v > 0]
    value = float(np.dot(np.asarray(costs, dtype=float), x))
    bound = value if st == highspy.HighsModelStatus.kOptimal else float(info.mip_dual_bound)
    return ("optimal" if st == highspy.HighsModelStatus.kOptimal else "feasible"), counts, value, bound


def solve_count(search, obj, need: int, deadline: float):
    """Count objectives (additive over instances, e.g. GPUs): the fewest, then among those plans
    the smallest makespan (threshold search with the count as one more row).

    Returns (status, counts, bound) with bound in the objective's unit."""
    costs = [obj.column_cost(c.degree, c.load, c.finish_sum) for c in search.configs]
    st, counts, value, bound = milp_min(search, costs, need, deadline)
    if counts is None:
        return st, None, None
    if st == "optimal" and time.perf_counter() < deadline:
        search.extra = (costs, round(value))
        res = search.run("makespan", None)
        search.extra = None
        if res.counts is not None:
            counts = res.counts
    return st, counts, bound


def solve_ratio(search, obj, need: int, deadline: float):
    """Ratio objectives whose numerator is additive over instances (e.g. dollars): Dinkelbach's
    method on MILPs ``min Σ (num_j − λ·on_j)·z_j``; λ is optimal when the minimum is ≥ 0.

    Returns (status, counts, λ as Fraction of numerator units per on-time session or None)."""
    from fractions import Fraction

    num = np.array([obj.column_cost(c.degree, c.load, c.finish_sum) for c in search.configs], dtype=float)
    on = np.array([c.on_time for c in search.configs], dtype=float)
    st, counts, _, _ = milp_min(search, num, need, deadline)
    if counts is None:
        return st, None, None

    def ratio(cs) -> Fraction:
        return Fraction(sum(obj.column_cost(c.degree, c.load, c.finish_sum) * r for c, r in cs), sum(c.on_time * r for c, r in cs))

    lam = ratio(counts)
    for _ in range(50):
        if time.perf_counter() >= deadline:
            return "feasible", counts, None
        st, cs, value, bound = milp_min(search, num - float(lam) * on, need, deadline)
        if cs is None:
            return "feasible", counts, None
        new = ratio(cs)
        scale = max(1.0, float(np.abs(num).max()))
        if st == "optimal" and value >= -1e-9 * scale:
            return "optimal", counts, lam
        if new < lam:
            lam, counts = new, cs
        else:
            return "feasible", counts, None
    return "feasible", counts, None
