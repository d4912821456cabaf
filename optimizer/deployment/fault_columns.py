"""Column formulation for fault scenarios (faults that may hit any GPU; cost, makespan, energy).

Under a fault the order of the sessions on an instance matters (which session is running at
``at_ms`` and how much of it is lost), so a column here is a TP degree and an *ordered*
sequence of session classes that fits one instance (memory, eq. 6-1). For each column j:
``L_j`` its load, ``on_j`` the sessions on time without a fault and, for every fault f, the
sessions on time ``onf_jf`` and the finish ``Lf_jf`` when f hits this instance (the session
running at ``at`` restarts from its first step at ``at + stall``; later ones follow). Of the
orders of one multiset only the Pareto-best ones on (on, onf, −Lf) are kept.

A fault hits one instance, so the scenarios of a plan are its used columns (a fault naming a
GPU: the one column whose instance the solver puts on that GPU, or none if it leaves the GPU
idle; servers are identical, so any instance can be placed there): the plan must keep
``on_total − on_j + onf_jf ≥ required`` for every used column and fault, and the worst-case
cost is ``max_{used j, f} G · max(M, Lf_jf) / (on_total − on_j + onf_jf)`` with ``M`` the
largest load. CP-SAT solves it with instance counts ``z_j`` and use literals ``u_j``; the
ratio by Dinkelbach iterations (as in :mod:`objectives.deployment.cost`). Exact; used when the columns
are few (small instances), otherwise the sequence formulation takes over.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

from optimizer.cpsat import ortools_cp_model, solve_cp
from optimizer.deployment.params import Option
from optimizer.deployment.units import ticks_down, ticks_up
from optimizer.deployment.schema import Problem
from optimizer.result import Status

MAX_ORDERS = 300_000  # orders examined in all; beyond this the sequence formulation is used


@dataclass(frozen=True)
class Column:
    degree: int
    order: tuple[int, ...]  # session classes in run order
    counts: tuple[int, ...]
    load: int
    on: int
    onf: tuple[int, ...]  # per fault
    lf: tuple[int, ...]  # per fault


def _timeline(order, t, d, fault=None) -> tuple[int, int]:
    """(sessions on time, finish of the last) for one instance, ticks; ``fault`` = (at, stall)."""
    now, on, hit = 0, 0, False
    for c in order:
        fin = now + t[c]
        if fault is not None and not hit and fin > fault[0]:
            hit = True
            fin = fault[0] + fault[1] + t[c]
        on += d[c] is None or fin <= d[c]
        now = fin
    return on, now


def enumerate_columns(problem: Problem, options: dict[int, Option], limit: int = MAX_ORDERS,
                      deadline: Optional[float] = None) -> Optional[list[Column]]:
    """Pareto-best ordered columns of every degree; None when more than ``limit`` orders (or
    class multisets, fitting or not) would be examined, or the wall clock passes ``deadline``
    (a ``time.perf_counter()`` value) first. The multisets are counted before any is examined:
    200 distinct sessions with a fault used to loop over 2^200 of them."""
    classes = problem.classes
    for opt in options.values():
        if math.prod(min(c.count, opt.cap[c.index]) + 1 for c in classes) > limit:
            return None
    d = [ticks_down(c.deadline_s) if c.deadline_s is not None else None for c in classes]
    faults = [(ticks_down(f.at_s), ticks_up(f.stall_s)) for f in problem.faults]
    seen = 0
    out: list[Column] = []
    for p, opt in options.items():
        caps = [min(c.count, opt.cap[c.index]) for c in classes]
        for counts in itertools.product(*[range(k + 1) for k in caps]):
            if not any(counts) or sum(k * opt.kv_bytes[i] for i, k in enumerate(counts)) > opt.room_bytes:
                continue
            best: dict[tuple, Column] = {}
            for order in multiset_orders(list(counts)):
                seen += 1
                if seen > limit or (deadline is not None and seen % 1024 == 0 and time.perf_counter() > deadline):
                    return None
                on, load = _timeline(order, opt.ticks, d)
                res = [_timeline(order, opt.ticks, d, f) for f in faults]
                col = Column(p, order, counts, load, on, tuple(r[0] for r in res), tuple(r[1] for r in res))
                key = (col.on, col.onf, tuple(-x for x in col.lf))
                best[key] = col
            keys = list(best)
            for k in keys:  # keep the Pareto-best orders
                if not any(o != k and all(a >= b for a, b in zip(_flat(o), _flat(k))) for o in keys):
                    out.append(best[k])
    return out


def multiset_orders(counts: list[int]):
    """Every distinct order of a multiset given as counts per class (no duplicates)."""
    n = sum(counts)
    order: list[int] = []

    def rec():
        if len(order) == n:
            yield tuple(order)
            return
        for c, k in enumerate(counts):
            if k:
                counts[c] -= 1
                order.append(c)
                yield from rec()
                order.pop()
                counts[c] += 1

    yield from rec()


def _flat(key) -> tuple:
    on, onf, neg_lf = key
    return (on, *onf, *neg_lf)


@dataclass
class ColumnOutcome:
    """``plan`` = (used (column, instances) pairs, the column whose instance holds the
    named GPU or None); None with ``proven`` when no plan exists. For the objective
    ``worst_on_time``, ``value`` is the most sessions on time in the worst scenario."""

    plan: tuple
    value: Fraction  # cost ratio (ticks·GPUs per session) or worst makespan (ticks)
    proven: bool
    bound: Optional[Fraction]
    solves: int


def solve_columns(problem: Problem, columns: list[Column], kind: str, required: int,
                  deadline: float) -> Optional[ColumnOutcome]:
    """Optimal plan over the columns (None when none is found in time).

    ``kind``: ``cost`` (ratio G·M/on) | ``makespan``, or ``worst_on_time`` (the most sessions that can
    be on time in the worst fault scenario, ignoring ``required``)."""
    g, n = problem.total_gpus, len(problem.sessions)

    def build(lam: Optional[Fraction], worst_on: bool = False):
        m = ortools_cp_model().CpModel()
        ubs = [min([c.count // k for c, k in zip(problem.classes, col.counts) if k] + [g // col.degree]) for col in columns]
        z = [m.new_int_var(0, ub, "") for ub in ubs]
        u = [m.new_bool_var("") for _ in columns]
        for zi, ui, ub in zip(z, u, ubs):
            m.add(zi <= ub * ui)
            m.add(zi >= ui)
        for c in problem.classes:
            m.add(sum(col.counts[c.index] * zi for col, zi in zip(columns, z) if col.counts[c.index]) == c.count)
        m.add(sum(col.degree * zi for col, zi in zip(columns, z)) <= g)
        horizon = max(max(col.lf + (col.load,)) for col in columns)
        M = m.new_int_var(0, horizon, "M")
        on = m.new_int_var(0, n, "on_time")  # one variable, so each scenario row stays short
        m.add(on == sum(col.on * zi for col, zi in zip(columns, z)))
        m.add(on >= max(required, 1 if kind == "cost" else 0))
        need = 0 if worst_on else max(required, 1 if kind == "cost" else 0)
        # which column's instance holds the named GPU (None: the GPU is left idle)
        named = [i for i, flt in enumerate(problem.faults) if flt.gpu is not None]
        h = [m.new_bool_var("") for _ in columns] if named else None
        if named:
            idle = m.new_bool_var("idle")
            m.add(sum(h) + idle == 1)
            for hi, ui in zip(h, u):
                m.add(hi <= ui)
            m.add(sum(col.degree * zi for col, zi in zip(columns, z)) <= g - 1).only_enforce_if(idle)

        def when(j, f):
            return [h[j]] if problem.faults[f].gpu is not None else [u[j]]

        for j, (col, ui) in enumerate(zip(columns, u)):
            m.add(M >= col.load).only_enforce_if(ui)
            for f in range(len(problem.faults)):
                m.add(on - col.on + col.onf[f] >= need).only_enforce_if(when(j, f))
        if worst_on:  # most sessions on time in the worst scenario, no on-time requirement
            T = m.new_int_var(0, n, "worst_on_time")
            m.add(T <= on)
            for j, col in enumerate(columns):
                for f in range(len(problem.faults)):
                    m.add(T <= on - col.on + col.onf[f]).only_enforce_if(when(j, f))
            m.maximize(T)
        elif lam is not None:
            big = lam.denominator * g * horizon + lam.numerator * n
            Z = m.new_int_var(-big, big, "Z")
            m.add(Z >= lam.denominator * g * M - lam.numerator * on)
            for j, col in enumerate(columns):
                for f in range(len(problem.faults)):
                    scen_on = on - col.on + col.onf[f]
                    m.add(Z >= lam.denominator * g * M - lam.numerator * scen_on).only_enforce_if(when(j, f))
                    m.add(Z >= lam.denominator * g * col.lf[f] - lam.numerator * scen_on).only_enforce_if(when(j, f))
            m.minimize(Z)
        else:
            W = m.new_int_var(0, horizon, "W")
            m.add(W >= M)
            for j, col in enumerate(columns):
                for f in range(len(problem.faults)):
                    m.add(W >= col.lf[f]).only_enforce_if(when(j, f))
            m.minimize(W)
        return m, z, h

    def read(solver, z, h):
        used = [(col, solver.value(zi)) for col, zi in zip(columns, z) if solver.value(zi) > 0]
        host = None
        if h is not None:
            host = next((columns[j] for j, hj in enumerate(h) if solver.boolean_value(hj)), None)
        on = sum(col.on * k for col, k in used)
        M = max(col.load for col, _ in used)
        worst_cost, worst_mk = Fraction(g * M, on), M
        for col, _ in used:
            for f, flt in enumerate(problem.faults):
                if flt.gpu is not None and col is not host:
                    continue
                s_on = on - col.on + col.onf[f]
                worst_cost = max(worst_cost, Fraction(g * max(M, col.lf[f]), s_on))
                worst_mk = max(worst_mk, col.lf[f])
        return (used, host), (worst_cost if kind == "cost" else Fraction(worst_mk))

    solves = 0
    if kind == "worst_on_time":
        m, z, h = build(None, worst_on=True)
        out = solve_cp(m, max(0.05, deadline - time.perf_counter()), workers=8)
        if out.status != Status.OPTIMAL:
            return None
        return ColumnOutcome(None, Fraction(int(out.objective)), True, None, 1)
    # the plan of least worst-case makespan: the answer for makespan/energy, the start for cost
    m, z, h = build(None)
    left = max(0.05, deadline - time.perf_counter())
    out = solve_cp(m, left if kind != "cost" else min(left, 5.0), workers=8)
    solves += 1
    if out.status == Status.INFEASIBLE:
        return ColumnOutcome(None, Fraction(0), True, None, solves)  # proven: no plan
    if out.status not in (Status.OPTIMAL, Status.FEASIBLE):
        return None
    used, lam = read(out.solver, z, h)
    if kind != "cost":
        return ColumnOutcome(used, lam, out.status == Status.OPTIMAL, Fraction(int(out.bound)), solves)
    # cost: Dinkelbach iterations from there
    while time.perf_counter() < deadline:
        m, z, h = build(lam)
        out = solve_cp(m, max(0.05, deadline - time.perf_counter()), workers=8)
        solves += 1
        if out.status not in (Status.OPTIMAL, Status.FEASIBLE):
            break
        if out.status == Status.OPTIMAL and out.objective >= 0:
            return ColumnOutcome(used, lam, True, lam, solves)
        new_used, new_lam = read(out.solver, z, h)
        if new_lam < lam:
            used, lam = new_used, new_lam
        else:
            break
    return ColumnOutcome(used, lam, False, None, solves)
