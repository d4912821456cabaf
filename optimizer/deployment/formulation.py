"""CP-SAT formulation of the deployment problem.

Decision variables:
  * instance slots: for every allowed TP degree p and server s, ``floor(G/p)`` candidate
    instances (``min`` with the session count); degrees above G span ``p/G`` whole servers.
    ``used[k]`` says whether slot k is an instance of the plan. Slots that are identical
    (same degree, same servers) are ordered (used, then load) to remove symmetry.
  * sessions: identical sessions form a class (same context, new tokens and deadline).
    - ``aggregate`` mode: ``x[k][c]`` sessions of class c on slot k, ``y[k][c]`` of them on
      time. Sessions on one instance run one after another; on-time ones first in EDD order,
      late ones after, which is optimal for the on-time count (Moore-Hodgson argument), so
      the deadline family is the EDD prefix condition and no order variables are needed.
    - ``sequence`` mode (faults or the latency objective): ``z[k][q][c]`` = position q of
      slot k holds a class-c session, with start/finish times per position.

Integer resolution (CP-SAT needs integer coefficients):
  * time: 1 tick = 10 ns (:data:`TIME_UNIT_S`); service times are rounded up and deadlines
    down, so a plan the solver calls on time is on time in exact arithmetic;
  * memory: bytes; KV per session rounded up, room per GPU rounded down.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from optimizer.cpsat import NamedModel
from optimizer.deployment.params import Option, build_options, degree_fits_hardware, degree_fits_model
from optimizer.deployment.perf import PerfModel
from optimizer.deployment.schema import Problem
from optimizer.deployment.units import Scenario, deadline_ticks, ticks_down, ticks_up

if TYPE_CHECKING:  # OR-Tools is imported when a model is built (NamedModel), not with this module
    from ortools.sat.python import cp_model

@dataclass(frozen=True)
class Slot:
    """A candidate instance: degree, the servers it occupies and GPUs per server.

    ``label`` is the element key used in constraint names, e.g. ``tp2#1@s0`` (the second
    TP2 slot on server 0) or ``tp16#0@s0-1`` (spanning servers 0 and 1).
    """

    index: int
    degree: int
    servers: tuple[int, ...]
    gpus_each: int
    ordinal: int

    @property
    def label(self) -> str:
        if not self.servers:  # pooled: the server is decided by the per-server counts
            return f"tp{self.degree}#{self.ordinal}"
        srv = f"s{self.servers[0]}" if len(self.servers) == 1 else f"s{self.servers[0]}-{self.servers[-1]}"
        return f"tp{self.degree}#{self.ordinal}@{srv}"


def build_slots(problem: Problem, options: dict[int, Option], pooled: bool = False) -> list[Slot]:
    """Candidate instances.

    pooled: slots of one degree are not tied to a server (``servers == ()``); how many of
    them each server hosts is decided by per-server counts (:mod:`constraints.deployment.gpus_per_server`),
    which removes the symmetry between servers and between slots of one degree.
    Otherwise each slot sits on given servers (needed when a fault names a GPU).
    """
    g, n_srv = problem.server.gpus, problem.servers
    n = len(problem.sessions)
    slots: list[Slot] = []
    for p in sorted(options, reverse=True):
        if max(options[p].cap, default=0) == 0:
            continue
        if pooled:
            count = min((g // p) * n_srv if p <= g else n_srv // (p // g), n)
            for i in range(count):
                slots.append(Slot(len(slots), p, (), min(p, g), i))
        elif p <= g:
            per_server = min(g // p, n)
            for s in range(n_srv):
                for i in range(per_server):
                    slots.append(Slot(len(slots), p, (s,), p, i))
        else:
            m = p // g
            for j in range(min(n_srv // m, n)):
                slots.append(Slot(len(slots), p, tuple(range(j * m, (j + 1) * m)), g, j))
    return slots


class BuildTimeout(Exception):
    """Building the CP-SAT model reached the solve's deadline (the time limit holds)."""


class Formulation:
    """Builds the CP-SAT model for one deployment problem.

    Args:
        problem: the resolved problem.
        perf: its performance model.
        degrees: the TP degrees the plan may use (subset of ``problem.degrees``).
        mode: ``aggregate`` or ``sequence`` (see module docstring).
        latency: build per-session finish-time variables (sequence mode).
        explain: guard every named constraint with an assumption literal.
    """

    def __init__(self, problem: Problem, perf: PerfModel, degrees, mode: str,
                 latency: bool = False, explain: bool = False, deadline: Optional[float] = None):
        self.problem = problem
        self.deadline = deadline  # time.perf_counter() value; building past it raises BuildTimeout
        self.perf = perf
        self.mode = mode
        self.latency = latency
        self.nm = NamedModel(explain=explain)
        self.model: cp_model.CpModel = self.nm.model
        self.options = build_options(problem, perf, degrees)
        self.pooled = mode == "aggregate"
        self.slots = build_slots(problem, self.options, pooled=self.pooled)
        self.classes = problem.classes
        self.n_sessions = len(problem.sessions)
        self.required = problem.required_on_time
        self.scenarios: list[Scenario] = []
        self.key_info: dict = {}  # ConstraintKey -> what it ranges over (for explanations)
        # horizon: every session on its slowest degree, plus every fault's delay
        worst = sum(c.count * max(o.ticks[c.index] for o in self.options.values()) for c in self.classes) if self.options else 0
        delay = sum(ticks_up(f.at_s + f.stall_s) for f in problem.faults)
        self.horizon = max(1, worst + delay + 1)
        self.deadline_ticks = deadline_ticks(self.classes)
        self._build_variables()

    # ------------------------------------------------------------------ variables
    def cap(self, k: Slot, c: int) -> int:
        """Upper bound of x[k][c]. In explain mode memory is left to the memory family (so
        that an infeasibility caused by memory names it) unless not even one session fits."""
        cap = self.options[k.degree].cap[c]
        if self.nm.explain and cap > 0:
            return self.classes[c].count
        return min(cap, self.classes[c].count)

    def ticks(self, k: Slot, c: int) -> int:
        return self.options[k.degree].ticks[c]

    def by_slot(self, var: dict) -> dict:
        """``{slot index: {class: variable}}`` of a ``{(slot, class): variable}`` map (x or y):
        the families read one slot's variables at a time, and scanning the whole map per slot
        made building quadratic (6,000 slots: 30 s past a 1.5 s limit)."""
        out: dict = {}
        for (k, c), v in var.items():
            out.setdefault(k, {})[c] = v
        return out

    def _build_variables(self) -> None:
        m = self.model
        self.x: dict[tuple[int, int], object] = {}
        self.used: dict[int, object] = {}
        self.W: dict[int, cp_model.IntVar] = {}
        self.M = m.new_int_var(0, self.horizon, "makespan")
        if self.mode == "aggregate":
            self._aggregate_variables()
        else:
            self._sequence_variables()

    def _aggregate_variables(self) -> None:
        m = self.model
        self.y: dict[tuple[int, int], cp_model.IntVar] = {}
        for n, k in enumerate(self.slots):
            if n % 64 == 0:
                self.check_time()
            u = m.new_bool_var(f"used[{k.label}]")
            self.used[k.index] = u
            terms = []
            load = []
            for c in self.classes:
                ub = self.cap(k, c.index)
                if ub <= 0:
                    continue
                x = m.new_int_var(0, ub, f"x[{k.label},{c.index}]")
                self.x[k.index, c.index] = x
                m.add(x <= ub * u)
                terms.append(x)
                load.append(self.ticks(k, c.index) * x)
                if c.deadline_s is not None:
                    y = m.new_int_var(0, ub, f"y[{k.label},{c.index}]")
                    m.add(y <= x)
                    self.y[k.index, c.index] = y
            if terms:
                m.add(sum(terms) >= u)
            else:
                m.add(u == 0)
            w = m.new_int_var(0, self.horizon, f"W[{k.label}]")
            m.add(w == sum(load))  # this slot's terms only (a scan of every x made it quadratic)
            self.W[k.index] = w
        on = [y for y in self.y.values()]
        on += [x for (k, c), x in self.x.items() if self.classes[c].deadline_s is None]
        self.on_time_total = sum(on) if on else 0

    def positions(self, k: Slot) -> int:
        """Positions of slot k: the most sessions that fit it by memory (at most N)."""
        opt = self.options[k.degree]
        sizes = sorted(opt.kv_bytes[c.index] for c in self.classes for _ in range(c.count) if opt.cap[c.index] > 0)
        room, q = opt.room_bytes, 0
        for s in sizes:
            if s > room:
                break
            room -= s
            q += 1
        return q

    def _sequence_variables(self) -> None:
        """Positions counted from the END of each instance's run: position 0 is the session
        that runs last. Then the sum of finish times is linear,
        ``Σ_r (r+1)·t(r)`` (the classic assignment formulation of 1||ΣC_j, whose LP bound
        is strong), and finish times are ``F_r = W − Σ_{r' < r} t(r')``; unused positions
        (r ≥ sessions on the instance) get ``F_r = 0``."""
        m = self.model
        self.z: dict[tuple[int, int, int], cp_model.IntVar] = {}
        self.F: dict[tuple[int, int], cp_model.IntVar] = {}
        self.o: dict[tuple[int, int], cp_model.IntVar] = {}
        self.filled: dict[tuple[int, int], object] = {}
        self.Q: dict[int, int] = {}
        self.finish_terms = []
        for k in self.slots:
            self.check_time()
            Q = self.positions(k)
            if self.nm.explain:
                Q = min(Q + 1, self.n_sessions)  # one more than memory allows: memory must say no
            self.Q[k.index] = Q
            prev_filled = None
            service = []  # t(r) expressions
            for r in range(Q):
                zs = {}
                for c in self.classes:
                    if self.cap(k, c.index) > 0:
                        zs[c.index] = m.new_bool_var(f"z[{k.label},{r},{c.index}]")
                        self.z[k.index, r, c.index] = zs[c.index]
                filled = sum(zs.values()) if zs else 0
                m.add(filled <= 1)
                if prev_filled is not None:
                    m.add(filled <= prev_filled)
                self.filled[k.index, r] = filled
                prev_filled = filled
                t = sum(self.ticks(k, c) * v for c, v in zs.items()) if zs else 0
                service.append(t)
                self.finish_terms.append((r + 1) * t)
            w = m.new_int_var(0, self.horizon, f"W[{k.label}]")
            m.add(w == (sum(service) if service else 0))
            self.W[k.index] = w
            done_after = 0  # service of the positions that run after position r
            for r in range(Q):
                f = m.new_int_var(0, self.horizon, f"F[{k.label},{r}]")
                m.add(f == w - done_after)
                done_after = done_after + service[r]
                o = m.new_bool_var(f"o[{k.label},{r}]")
                m.add(o <= self.filled[k.index, r])
                self.F[k.index, r], self.o[k.index, r] = f, o
            for c in self.classes:
                vs = [self.z[k.index, r, c.index] for r in range(Q) if (k.index, r, c.index) in self.z]
                if vs:
                    self.x[k.index, c.index] = sum(vs)
            u = m.new_bool_var(f"used[{k.label}]")
            self.used[k.index] = u
            if Q:
                m.add(u == self.filled[k.index, 0])
            else:
                m.add(u == 0)
        self.on_time_total = sum(self.o.values()) if self.o else 0

    # ------------------------------------------------------------------ helpers
    def slots_on_server(self, s: int) -> list[Slot]:
        return [k for k in self.slots if s in k.servers]

    def identical_runs(self) -> list[list[Slot]]:
        """Groups of interchangeable slots (same degree, same servers), in ordinal order."""
        groups: dict[tuple, list[Slot]] = {}
        for k in self.slots:
            groups.setdefault((k.degree, k.servers), []).append(k)
        return [sorted(v, key=lambda s: s.ordinal) for v in groups.values() if len(v) > 1]

    def finish_sum(self):
        """Sum of finish times over all sessions (ticks), sequence mode."""
        terms = getattr(self, "finish_terms", None)
        return sum(terms) if terms else 0

    def check_time(self) -> None:
        """Raise :class:`BuildTimeout` once the deadline has passed."""
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            raise BuildTimeout(f"building the {self.mode} model for {self.n_sessions} sessions reached the time limit")

    def build(self) -> "Formulation":
        """Add every constraint family, then the nominal scenario (and fault scenarios).

        Raises:
            BuildTimeout: the deadline passed while building (checked between families and
                per instance slot of the sequence variables).
        """
        from constraints.deployment import FAMILIES_AFTER_NOMINAL, FAMILIES_BEFORE_NOMINAL

        for family in FAMILIES_BEFORE_NOMINAL:
            self.check_time()
            family.define(self, self.problem)
        self.scenarios.append(Scenario("nominal", [self.M], self.on_time_total, self.finish_sum()))
        for family in FAMILIES_AFTER_NOMINAL:
            self.check_time()
            family.define(self, self.problem)
        return self
