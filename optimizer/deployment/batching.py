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

Search space (exact over it): a *configuration* is (layout, batch limit b, multiset of session
classes) that fits the memory of one instance. Its timeline is a deterministic simulation
once the admission order is fixed; the order is fixed by rule:

* b = 1: Moore-Hodgson order (on-time sessions by deadline, late ones after), optimal for
  the on-time count on one machine, and the makespan does not depend on the order;
* b > 1: earliest deadline first (no deadline last; ties: fewer new tokens, then shorter
  context).

Batch limits tried per configuration of n sessions: 1, the powers of two below n, and n (no
limit), each capped by ``deployment.max_batch``. The configuration LP/MILP
(:class:`~optimizer.deployment.configurations.ConfigurationSearch`) then chooses how many
instances run each configuration, with the GPU row exact because every layout's GPU count
divides the server or is a multiple of it. A plan is optimal over every assignment of
sessions to instances, every listed layout and every batch limit above, under these
admission rules; the brute-force test enumerates exactly that space.
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
from optimizer.model.perf import batch_step_table

MAX_BATCH_CONFIGURATIONS = 200_000
MEMO_SEGMENTS = 500_000  # cached timeline segments per performance model (cleared beyond)


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
    m = perf.model
    table = batch_step_table(m)
    memo = table.__dict__.setdefault("segments", {})
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
                dts = m.single_session_step_s(lay, pos[0] + np.arange(k))
            else:
                dts = table.step_times_s(lay, np.array(pos, dtype=np.float64), k, rank=np.array(rank))
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


def enumerate_batch_configurations(problem: Problem, perf, options: dict[Layout, LayoutOption],
                                   deadline: Optional[float] = None,
                                   limit: int = MAX_BATCH_CONFIGURATIONS) -> Optional[list[BatchConfiguration]]:
    """Every (layout, batch limit, class multiset) that fits one instance's memory; None when
    there are more than ``limit`` or the wall clock passes ``deadline`` first."""
    classes = problem.classes
    cap_b = problem.batch_cap
    single = {lay: [ticks_up(perf.model.single_session_step_s(lay, np.arange(c.context, c.context + c.new)).sum())
                    for c in classes] for lay in options}
    out: list[BatchConfiguration] = []
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
            for b in batch_limits(len(jobs), cap_b):
                order = admission_order(jobs, ticks, b)
                ordered = [jobs[i] for i in order]
                if dp > 1:  # DP ranks follow the admission order: check the fullest rank exactly
                    mem = perf.model.memory_per_gpu(lay, [(c, nw) for c, nw, _ in ordered],
                                                    [i % dp for i in range(len(ordered))])
                    if mem > mem_limit:
                        continue
                _, fin = simulate(perf, lay, [(c, nw) for c, nw, _ in ordered], b)
                on = sum(1 for (_, _, d), f in zip(ordered, fin) if d is None or f <= d + 1e-9)
                out.append(BatchConfiguration(lay.gpus, tuple(counts), ticks_up(max(fin)), on, lay, b,
                                              sum(ticks_up(f) for f in fin)))
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

        if not rec(0, np.zeros(len(static))):
            return None
    return out


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
