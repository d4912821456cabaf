"""The serving solution: frozen dataclasses, built once by :func:`optimizer.serving.solve_problem`.

A :class:`ServingSolution` holds, per rate of the sweep, every mode's :class:`ModePlan` (the
MILP's :class:`~optimizer.serving.solve.ModeResult`, its simulation and the capacity margin it
needed), and picks the best plan of a rate (:meth:`ServingSolution.best`) and the status.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from optimizer.result import Status
from optimizer.serving.perf import ServingModel, Worker
from optimizer.serving.schema import Problem
from optimizer.serving.simulate import SimResult
from optimizer.serving.solve import ModeResult

NOT_BEGUN = "the time limit had passed before this rate and mode began"


@dataclass(frozen=True)
class ModePlan:
    """One mode's plan at one rate.

    Attributes:
        mode: ``aggregated`` or ``disaggregated``.
        result: the MILP's result (counts, value, bound, status).
        sim: the SimPy check of the plan at ``rate`` (None: simulation off, or not reached).
        rate: the rate served (req/s; goodput: the highest rate the simulation accepted).
        margin: the capacity factor the plan was solved for (1 = none).
        sim_failed: the simulated attainment stayed below target even at the last margin (no plan).
        sim_cut: the time limit ended its simulation (what it had simulated): analytic checks only.
        role_margins: ``{role: m}``, the ``simulated`` cuts of the plan's MILP (empty: none).
        exhausted: the plan is the most capacity the GPUs hold (the capacity search ran out of GPUs).
    """

    mode: str
    result: ModeResult
    sim: Optional[SimResult] = None
    rate: float = 0.0
    margin: float = 1.0
    sim_failed: bool = False
    sim_cut: Optional[str] = None
    role_margins: Mapping[str, float] = field(default_factory=dict)
    exhausted: bool = False

    @property
    def ok(self) -> bool:
        return self.result.counts is not None and not self.sim_failed


@dataclass(frozen=True)
class RateResult:
    """Every mode's plan at one rate (req/s): ``plans`` ``{mode: ModePlan}``."""

    rate: float
    plans: Mapping[str, ModePlan]


@dataclass(frozen=True)
class ServingSolution:
    """The plans of every rate and mode.

    Attributes:
        problem: the problem solved (its SLO targets, pools, objective).
        model: the analytic model the worker rates came from.
        workers: every worker configuration of the modes asked (``counts`` index into it).
        objective: the :class:`~objectives.serving.ServingObjective` optimised.
        results: one :class:`RateResult` per rate of the sweep (goodput: the first rate only).
        time_s: wall time of the solve, s.
    """

    problem: Problem
    model: ServingModel
    workers: tuple[Worker, ...]
    objective: Any
    results: tuple[RateResult, ...]
    time_s: float

    def best(self, rr: RateResult) -> Optional[ModePlan]:
        """The rate's best plan: best objective, then fewest GPUs, then mode name; None without one.
        A closed loop's plans whose simulation the time limit cut are unchecked, so a checked plan
        comes first whatever its objective."""
        ok = [m for m in rr.plans.values() if m.ok]
        if not ok:
            return None
        sign = -1 if self.objective.sense == "max" else 1
        closed = self.problem.concurrency is not None
        return min(ok, key=lambda m: (closed and m.sim_cut is not None, sign * m.result.value, self.gpus(m), m.mode))

    @property
    def status(self) -> Status:
        """Optimal when every rate's best plan is proven; infeasible when a rate has no plan
        (time_limit when a solve ran out of time without one)."""
        bests = [self.best(rr) for rr in self.results]
        if any(b is None for b in bests):
            short = [rr for rr, b in zip(self.results, bests) if b is None]
            timed_out = [rr for rr in short if any(m.result.status == Status.TIME_LIMIT for m in rr.plans.values())]
            if len(timed_out) < len(short):
                # a rate no mode serves: proven by the MILP for open-loop traffic; for a closed loop
                # the sizing is a search (closed_loop_rates), so nothing is proven
                return Status.NOT_FOUND if self.problem.concurrency is not None else Status.INFEASIBLE
            # rates the time limit left without a plan: the sweep is not answered (exit 4); the
            # solved rates' plans stand in the result and cut_short names the rest
            return Status.TIME_LIMIT
        if self.problem.concurrency is not None and any(b.sim_cut for b in bests):
            return Status.TIME_LIMIT  # a closed loop's plan is checked by its simulation only: none was
        return Status.OPTIMAL if all(b.result.status == Status.OPTIMAL for b in bests) else Status.FEASIBLE

    def headline(self) -> RateResult:
        """The largest rate with a plan (a time limit may leave the sweep's last rates unsolved),
        else the last rate: the rate the envelope's objective and binding limits are about."""
        return next((rr for rr in reversed(self.results) if self.best(rr) is not None), self.results[-1])

    def gpus(self, m: ModePlan) -> int:
        """GPUs of the plan."""
        return sum(self.workers[j].gpus * n for j, n in (m.result.counts or {}).items())

    def dollars(self, m: ModePlan) -> Optional[float]:
        """$/hour of the plan; None when a pool used has no price."""
        tot = 0.0
        for j, n in (m.result.counts or {}).items():
            w = self.workers[j]
            price = self.problem.pools[w.pool].price
            if price is None:
                return None
            tot += price * w.gpus * n
        return tot
